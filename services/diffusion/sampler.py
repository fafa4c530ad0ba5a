"""The sampler of diffusers' CosineDPMSolverMultistepScheduler (2nd-order SDE DPM-Solver++, midpoint),
vectorised over a batch whose samples may sit at different steps of different schedules.

All sampler state (sigmas, latents, the previous denoised estimate) is fp32 whatever dtype the DiT runs
in. Noise comes from one device generator per sample instead of a Brownian tree: over the disjoint step
intervals the tree's normalised increments are i.i.d. N(0, 1), so the distribution is the same, there is
no host work per step, and nothing fails at the ends of the schedule (diffusers' crash #13274).
"""

from __future__ import annotations

import math

import torch


def make_sigmas(num_steps: int, sigma_min: float, sigma_max: float) -> torch.Tensor:
    """(num_steps + 1,) fp32 on the CPU: the exponential schedule from sigma_max down to sigma_min, then 0.

    Computed exactly as diffusers does (log-spaced in fp32), so the values match bit for bit."""
    sigmas = torch.linspace(math.log(sigma_min), math.log(sigma_max), num_steps).exp().flip(0)
    return torch.cat([sigmas.to(torch.float32), torch.zeros(1, dtype=torch.float32)])


def sigma_to_timestep(sigma: torch.Tensor) -> torch.Tensor:
    """The DiT's time input, t = atan(σ)·2/π, kept in the dtype of `sigma` (fp32)."""
    return sigma.atan() / math.pi * 2


class SampleNoise:
    """All the randomness of one sample: a device generator seeded once, drawn in a fixed order
    (the initial latents, then one draw per stochastic step), so a sample's noise never depends on the
    batch it runs in."""

    def __init__(self, seed: int, device: torch.device) -> None:
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.device = device

    def initial_latents(self, shape: tuple[int, ...], init_noise_sigma: float) -> torch.Tensor:
        """Unit noise times init_noise_sigma, fp32, `shape` = (latent_channels, latent_frames)."""
        return self.unit_noise(shape) * init_noise_sigma

    def unit_noise(self, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator, device=self.device, dtype=torch.float32)


def input_scale(sigma: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """c_in of the EDM preconditioning: the factor applied to the latents before the DiT."""
    return 1 / (sigma**2 + sigma_data**2).sqrt()


def denoise(latents: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor, sigma_data: float) -> torch.Tensor:
    """x0 estimate from a v-prediction: c_skip·x + c_out·v. `sigma` broadcasts against `latents`."""
    c_skip = sigma_data**2 / (sigma**2 + sigma_data**2)
    c_out = -sigma * sigma_data / (sigma**2 + sigma_data**2).sqrt()
    return c_skip * latents + c_out * velocity


def dpm_solver_step(
    latents: torch.Tensor,
    denoised: torch.Tensor,
    previous_denoised: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    sigma_previous: torch.Tensor,
    is_second_order: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """One SDE DPM-Solver++ step for a batch; every argument is fp32 and broadcasts as (B, 1, 1).

    latents, denoised, previous_denoised, noise: (B, C, L); sigma, sigma_next, sigma_previous: (B, 1, 1);
    is_second_order: (B, 1, 1) bool, False on a schedule's first and last step (as diffusers does with
    final_sigmas_type "zero"). With λ = −log σ and h = λ_next − λ, diffusers' exp(−h) is σ_next/σ, which
    stays finite when σ_next = 0: the last step then returns the x0 estimate exactly.
    """
    ratio = sigma_next / sigma
    decay = ratio * ratio  # σ_next/σ · exp(−h)
    gain = 1 - decay  # 1 − exp(−2h)
    # Midpoint correction D1 = (m0 − m1)/r0 with r0 = h_previous / h; only read where is_second_order.
    safe_next = torch.where(is_second_order, sigma_next, sigma)
    h = torch.log(sigma) - torch.log(safe_next)
    h_previous = torch.log(sigma_previous) - torch.log(sigma)
    step_ratio = torch.where(is_second_order, h / h_previous, 0.0)
    correction = (denoised - previous_denoised) * step_ratio
    return decay * latents + gain * (denoised + 0.5 * correction) + sigma_next * gain.sqrt() * noise

"""The sampler against diffusers' CosineDPMSolverMultistepScheduler, without any model in the loop."""

from __future__ import annotations

import pytest
import torch
from diffusers import CosineDPMSolverMultistepScheduler

from chorus.diffusion.presets import SCHEDULER_CONFIG
from chorus.diffusion.sampler import denoise, dpm_solver_step, input_scale, make_sigmas, sigma_to_timestep

SHAPE = (3, 4, 16)


class _GivenNoiseScheduler(CosineDPMSolverMultistepScheduler):
    given_noise: list[torch.Tensor]

    def set_timesteps(self, *args, **kwargs) -> None:
        super().set_timesteps(*args, **kwargs)
        draws = iter(self.given_noise)
        self.noise_sampler = lambda sigma, sigma_next: next(draws)


def _our_trajectory(num_steps, initial, velocities, noises):
    sigmas = make_sigmas(num_steps, 0.3, 500.0)
    latents, previous = initial, torch.zeros_like(initial)
    for step in range(num_steps):
        sigma, sigma_next, sigma_previous = (sigmas[i].reshape(1, 1, 1) for i in (step, step + 1, max(step - 1, 0)))
        denoised = denoise(latents, velocities[step], sigma, 1.0)
        is_second_order = torch.tensor(0 < step < num_steps - 1).reshape(1, 1, 1)
        latents = dpm_solver_step(
            latents, denoised, previous, sigma, sigma_next, sigma_previous, is_second_order, noises[step]
        )
        previous = denoised
    return latents


@pytest.mark.parametrize("num_steps", [1, 2, 3, 10, 100])
def test_schedule_and_steps_match_diffusers(num_steps):
    generator = torch.Generator().manual_seed(num_steps)
    initial = torch.randn(SHAPE, generator=generator) * 500
    velocities = [torch.randn(SHAPE, generator=generator) for _ in range(num_steps)]
    noises = [torch.randn(SHAPE, generator=generator) for _ in range(num_steps)]

    scheduler = _GivenNoiseScheduler.from_config(SCHEDULER_CONFIG)
    scheduler.given_noise = noises
    scheduler.set_timesteps(num_steps)
    assert torch.equal(make_sigmas(num_steps, 0.3, 500.0), scheduler.sigmas)
    assert torch.equal(sigma_to_timestep(scheduler.sigmas[:-1]), scheduler.timesteps)
    expected = initial
    for step, timestep in enumerate(scheduler.timesteps):
        scaled = scheduler.scale_model_input(expected, timestep)
        torch.testing.assert_close(scaled, expected * input_scale(scheduler.sigmas[step], 1.0))
        expected = scheduler.step(velocities[step], timestep, expected).prev_sample

    ours = _our_trajectory(num_steps, initial, velocities, noises)
    assert bool(ours.isfinite().all())
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_batched_step_equals_per_sample_steps_at_different_positions():
    """Two samples on different schedules and steps share one call and get what they get alone."""
    generator = torch.Generator().manual_seed(0)
    schedules = [make_sigmas(10, 0.3, 500.0), make_sigmas(4, 0.3, 500.0)]
    steps = [5, 3]  # a second-order step, and the final σ → 0 step
    tensors = [[torch.randn(1, 4, 16, generator=generator) for _ in range(4)] for _ in schedules]

    def arguments(index):
        sigmas, step = schedules[index], steps[index]
        latents, denoised, previous, noise = tensors[index]
        sigma, sigma_next, sigma_previous = (sigmas[i].reshape(1, 1, 1) for i in (step, step + 1, step - 1))
        is_second_order = torch.tensor(0 < step < len(sigmas) - 2).reshape(1, 1, 1)
        return latents, denoised, previous, sigma, sigma_next, sigma_previous, is_second_order, noise

    alone = [dpm_solver_step(*arguments(i)) for i in range(2)]
    batched = dpm_solver_step(*(torch.cat(parts) for parts in zip(arguments(0), arguments(1), strict=True)))
    torch.testing.assert_close(batched, torch.cat(alone))
    # The last step returns the x0 estimate exactly, with no noise.
    torch.testing.assert_close(alone[1], tensors[1][1])

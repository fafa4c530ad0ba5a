"""The only code of the engine that touches tensors: start samples, advance a batch one step, decode.

A batch is any list of live samples; each carries its own schedule, step index, guidance, conditioning
and noise generator, so samples with different step counts, durations or prompts share one DiT forward
(CFG rows included) and join or leave between steps. Nothing here reads a device tensor back to the host
during denoising: the per-step decisions (first/last step, which rows use CFG) are host-side integers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from chorus.diffusion.conditioning import ConditioningRequest, SampleConditioning, build_conditioning
from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine.request import SampleFormat
from chorus.diffusion.graphs import GraphedDenoiser
from chorus.diffusion.loader import StableAudioModels
from chorus.diffusion.sampler import (
    SampleNoise,
    denoise,
    dpm_solver_step,
    input_scale,
    make_sigmas,
    sigma_to_timestep,
)

# Latent frames decoded on each side of the requested span. One latent frame of the released Oobleck
# decoder reaches output samples about 10 frames (20480 samples) away, so 32 frames leave the requested
# samples untouched by the cut.
DECODE_MARGIN_FRAMES = 32

# The largest float a 16-bit sample takes, as float32 (exact: 1 - 2⁻¹⁵).
S16_MAX = 32767 / 32768

# latents, timesteps, cross_context, global_context → velocity, as StableAudioDenoiser.__call__.
Denoiser = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """What one output needs: its conditioning inputs, step count and seed."""

    prompt: str
    negative_prompt: str | None
    start_s: float
    end_s: float
    guidance_scale: float
    num_steps: int
    seed: int


@dataclass(slots=True)
class SampleState:
    """Sampler state of one live sample; tensors are fp32 on the model device.

    latents, previous_denoised: (C, L); sigmas: (num_steps + 1,)."""

    spec: SampleSpec
    conditioning: SampleConditioning
    noise: SampleNoise
    sigmas: torch.Tensor
    latents: torch.Tensor
    previous_denoised: torch.Tensor
    step_index: int = 0

    @property
    def is_done(self) -> bool:
        return self.step_index == self.spec.num_steps


class DiffusionRunner:
    """Runs Stable Audio Open sampling for batches of samples on `models.device`."""

    def __init__(
        self,
        models: StableAudioModels,
        max_graph_rows: int = 0,
        compile_dit: bool = False,
        compile_mode: str = "default",
        attention_backend: str = "auto",
        denoiser: Denoiser | None = None,
    ) -> None:
        """max_graph_rows > 0 captures CUDA graphs of the DiT for up to that many rows (2 per sample with
        CFG) when the models are on a GPU; capture happens here, so build the runner at startup.
        compile_dit compiles the DiT blocks (while capturing: one variant per bucket); it is only allowed
        together with graphs, whose buckets keep the shapes static. compile_mode and attention_backend:
        see StableAudioDenoiser. `denoiser` replaces the DiT forward (a parallel group's rank 0); it
        excludes graphs and compile."""
        if denoiser is not None and (max_graph_rows > 0 or compile_dit):
            raise ValueError("denoiser: a given denoiser runs without CUDA graphs or compile")
        if compile_dit and not (max_graph_rows > 0 and models.device.type == "cuda"):
            raise ValueError("compile_dit: needs CUDA graphs on a CUDA device (static shapes)")
        self.models = models
        self._latent_shape = (models.num_latent_channels, models.num_latent_frames)
        if denoiser is not None:
            self.denoiser: Denoiser = denoiser
            return
        denoiser = StableAudioDenoiser(
            models.transformer,
            models.time_frequencies,
            compile_blocks=compile_dit,
            compile_mode=compile_mode,
            attention_backend=attention_backend,
        )
        self.denoiser = denoiser
        if max_graph_rows > 0 and models.device.type == "cuda":
            self.denoiser = GraphedDenoiser.captured(denoiser, models, max_graph_rows)

    def close(self) -> None:
        """Frees the captured graphs and their memory pool; the runner then runs eagerly."""
        if isinstance(self.denoiser, GraphedDenoiser):
            self.denoiser.release()
            self.denoiser = self.denoiser.denoiser

    def start(self, specs: Sequence[SampleSpec]) -> list[SampleState]:
        """New sample states: conditioning for all specs in one text-encoder call, then initial noise."""
        conditioning = build_conditioning(
            self.models,
            [ConditioningRequest(s.prompt, s.negative_prompt, s.start_s, s.end_s, s.guidance_scale) for s in specs],
        )
        schedule = self.models.schedule
        states = []
        for spec, sample_conditioning in zip(specs, conditioning, strict=True):
            noise = SampleNoise(spec.seed, self.models.device)
            latents = noise.initial_latents(self._latent_shape, schedule.init_noise_sigma)
            sigmas = make_sigmas(spec.num_steps, schedule.sigma_min, schedule.sigma_max).to(self.models.device)
            states.append(SampleState(spec, sample_conditioning, noise, sigmas, latents, torch.zeros_like(latents)))
        return states

    @torch.inference_mode()
    def step(self, states: Sequence[SampleState]) -> None:
        """Advances every state by one step, in place, with one DiT forward for the whole batch."""
        assert states and not any(s.is_done for s in states)
        sigma_data = self.models.schedule.sigma_data
        latents = torch.stack([s.latents for s in states])
        sigma = torch.stack([s.sigmas[s.step_index] for s in states])
        sigma_next = torch.stack([s.sigmas[s.step_index + 1] for s in states])
        # The first step has no previous sigma; any positive stand-in works because it is not read.
        sigma_previous = torch.stack([s.sigmas[max(s.step_index - 1, 0)] for s in states])

        velocity = self._guided_velocity(states, latents * input_scale(sigma, sigma_data)[:, None, None], sigma)
        sigma_b, sigma_next_b, sigma_previous_b = (x[:, None, None] for x in (sigma, sigma_next, sigma_previous))
        denoised = denoise(latents, velocity, sigma_b, sigma_data)
        is_second_order = self._to_device([0 < s.step_index < s.spec.num_steps - 1 for s in states])[:, None, None]
        noise = torch.stack([self._step_noise(s) for s in states])
        previous_denoised = torch.stack([s.previous_denoised for s in states])
        new_latents = dpm_solver_step(
            latents, denoised, previous_denoised, sigma_b, sigma_next_b, sigma_previous_b, is_second_order, noise
        )
        for state, sample_latents, sample_denoised in zip(states, new_latents, denoised, strict=True):
            state.latents = sample_latents
            state.previous_denoised = sample_denoised
            state.step_index += 1

    @torch.inference_mode()
    def decode(self, state: SampleState, sample_format: SampleFormat = SampleFormat.F32) -> torch.Tensor:
        """(num_audio_channels, num_samples) CPU waveform of a finished sample, fp32 or (S16) int16 (`to_s16`, on
        the device: 1.8 MB instead of 3.5 to copy and send per 10 s), cropped to its [start_s, end_s) span of the
        window. One sample at a time, so VAE memory does not grow with batch,
        and only the latent frames the span needs plus a margin wider than the decoder's receptive field,
        so VAE cost follows the requested duration and the samples equal a full-window decode's.

        Its memory is interleaved by channel (a transposed view of (num_samples, num_audio_channels)), the
        wire's layout: the device transposes it (free on a GPU), not the host (1-3 ms per 10 s of stereo)."""
        assert state.is_done
        vae, hop = self.models.vae, self.models.hop_samples
        rate_hz = self.models.sample_rate_hz
        first_sample, end_sample = int(state.spec.start_s * rate_hz), int(state.spec.end_s * rate_hz)
        first_frame = max(0, first_sample // hop - DECODE_MARGIN_FRAMES)
        end_frame = min(self.models.num_latent_frames, -(-end_sample // hop) + DECODE_MARGIN_FRAMES)
        audio = vae.decode(state.latents[None, :, first_frame:end_frame].to(vae.dtype)).sample[0]
        offset = first_frame * hop
        span = audio[:, first_sample - offset : end_sample - offset].to(torch.float32)
        if sample_format is SampleFormat.S16:
            span = to_s16(span)
        return span.T.contiguous().cpu().T

    def generate(self, specs: Sequence[SampleSpec]) -> list[torch.Tensor]:
        """Runs `specs` to the end as one batch (samples leave it as they finish); returns the waveforms."""
        states = self.start(specs)
        while live := [s for s in states if not s.is_done]:
            self.step(live)
        return [self.decode(s) for s in states]

    def _guided_velocity(self, states: Sequence[SampleState], model_input: torch.Tensor, sigma: torch.Tensor):
        """(B, C, L) fp32 velocity; rows with guidance > 1 get uncond + g·(cond − uncond) from extra rows
        appended to the same forward."""
        cfg_rows = [i for i, s in enumerate(states) if s.conditioning.uncond_cross_context is not None]
        cross = [s.conditioning.cross_context for s in states]
        cross += [states[i].conditioning.uncond_cross_context for i in cfg_rows]
        global_context = [s.conditioning.global_context for s in states]
        global_context += [global_context[i] for i in cfg_rows]
        rows = self._to_device(list(range(len(states))) + cfg_rows)
        timesteps = sigma_to_timestep(sigma)
        output = self.denoiser(
            model_input.index_select(0, rows),
            timesteps.index_select(0, rows),
            torch.stack(cross),
            torch.stack(global_context),
        ).to(torch.float32)
        velocity = output[: len(states)]
        if not cfg_rows:
            return velocity
        cond = velocity.index_select(0, rows[len(states) :])
        uncond = output[len(states) :]
        guidance = self._to_device([states[i].spec.guidance_scale for i in cfg_rows])
        guided = uncond + guidance[:, None, None] * (cond - uncond)
        return velocity.index_copy(0, rows[len(states) :], guided)

    def _to_device(self, values: list) -> torch.Tensor:
        """A small host list on the device without a sync: pinned memory and a non-blocking copy on CUDA."""
        host = torch.tensor(values)
        if self.models.device.type != "cuda":
            return host
        return host.pin_memory().to(self.models.device, non_blocking=True)

    def _step_noise(self, state: SampleState) -> torch.Tensor:
        # The last step lands on σ = 0 where the noise term vanishes, so nothing is drawn for it.
        if state.step_index == state.spec.num_steps - 1:
            return torch.zeros(self._latent_shape, device=self.models.device)
        return state.noise.unit_noise(self._latent_shape)


def to_s16(samples: torch.Tensor) -> torch.Tensor:
    """fp32 samples → int16 exactly as a 16-bit file's encoder converts them (the gateway's `_s16le`): clipped to
    [-1, S16_MAX], times 32768, truncated. Every step is exact in fp32, so the bytes are the same wherever it runs."""
    return (samples.clamp(-1.0, S16_MAX) * 32768.0).to(torch.int16)

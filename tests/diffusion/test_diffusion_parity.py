"""Parity with diffusers' StableAudioPipeline on the tiny random model.

Both sides run the same modules. The pipeline gets our noise: its initial latents are our samples' first
draws and its scheduler's Brownian tree is replaced by our per-step draws (a second SampleNoise with the
same seed replays them), so any difference comes from conditioning, the DiT call or the sampler math.
"""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import CosineDPMSolverMultistepScheduler, StableAudioPipeline

from chorus.diffusion.conditioning import ConditioningRequest, build_conditioning
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.presets import SCHEDULER_CONFIG
from chorus.diffusion.sampler import SampleNoise

pytestmark = pytest.mark.parity


class _ReplayedNoiseScheduler(CosineDPMSolverMultistepScheduler):
    """The released scheduler with its Brownian-tree noise replaced by a given (B, C, L) draw per step."""

    replayed_noise: list[torch.Tensor]
    final_noise: torch.Tensor

    def set_timesteps(self, *args, **kwargs) -> None:
        super().set_timesteps(*args, **kwargs)
        draws = iter(self.replayed_noise)
        # The σ → 0 step multiplies its noise by 0; we draw none there.
        self.noise_sampler = lambda sigma, sigma_next: next(draws) if sigma_next > 0 else self.final_noise


def _pipeline(models, replayed_noise, final_noise):
    scheduler = _ReplayedNoiseScheduler.from_config(SCHEDULER_CONFIG)
    scheduler.replayed_noise = replayed_noise
    scheduler.final_noise = final_noise
    # Same weights, stock attention processors (ours replaces the self-attention one).
    transformer = copy.deepcopy(models.transformer)
    transformer.set_default_attn_processor()
    return StableAudioPipeline(
        vae=models.vae,
        text_encoder=models.text_encoder,
        projection_model=models.projection_model,
        tokenizer=models.tokenizer,
        transformer=transformer,
        scheduler=scheduler,
    )


def _replay_noise(models, seeds, num_steps):
    """Initial unit latents (B, C, L) and per-step noise, drawn in SampleNoise's documented order."""
    shape = (models.num_latent_channels, models.num_latent_frames)
    sources = [SampleNoise(seed, models.device) for seed in seeds]
    initial = torch.stack([s.unit_noise(shape) for s in sources])
    steps = [torch.stack([s.unit_noise(shape) for s in sources]) for _ in range(num_steps - 1)]
    return initial, steps


CASES = {
    "cfg": dict(
        prompts=["a dog barks", "Rain on a tin roof, 120 BPM"],
        negatives=None,
        guidance=7.0,
        start_s=0.0,
        end_s=0.5,
        num_steps=8,
    ),
    "negative_prompt": dict(
        prompts=["birds singing", "a synth pad"],
        negatives=["low quality", "hiss, noise"],
        guidance=3.5,
        start_s=0.1,
        end_s=0.6,
        num_steps=6,
    ),
    "no_cfg": dict(prompts=["footsteps"], negatives=None, guidance=1.0, start_s=0.0, end_s=0.74, num_steps=4),
    "one_step": dict(prompts=["a bell"], negatives=None, guidance=7.0, start_s=0.0, end_s=0.2, num_steps=1),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_conditioning_and_waveform_match_pipeline(tiny_models, case):
    seeds = [11 + i for i in range(len(case["prompts"]))]
    negatives = case["negatives"] or [None] * len(case["prompts"])
    specs = [
        SampleSpec(p, n, case["start_s"], case["end_s"], case["guidance"], case["num_steps"], seed)
        for p, n, seed in zip(case["prompts"], negatives, seeds, strict=True)
    ]
    ours = DiffusionRunner(tiny_models).generate(specs)

    initial, step_noise = _replay_noise(tiny_models, seeds, case["num_steps"])
    pipe = _pipeline(tiny_models, step_noise, torch.zeros_like(initial))
    captured = []
    pipe.transformer.register_forward_pre_hook(lambda _m, _a, kw: captured.append(kw), with_kwargs=True)
    reference = pipe(
        prompt=case["prompts"],
        negative_prompt=case["negatives"],
        audio_start_in_s=case["start_s"],
        audio_end_in_s=case["end_s"],
        num_inference_steps=case["num_steps"],
        guidance_scale=case["guidance"],
        latents=initial,
        output_type="pt",
    ).audios
    pipe.transformer._forward_pre_hooks.clear()

    conditioning = build_conditioning(
        tiny_models,
        [ConditioningRequest(s.prompt, s.negative_prompt, s.start_s, s.end_s, s.guidance_scale) for s in specs],
    )
    cross = torch.stack([c.cross_context for c in conditioning])
    global_context = torch.stack([c.global_context for c in conditioning])
    if case["guidance"] > 1:
        cross = torch.cat([torch.stack([c.uncond_cross_context for c in conditioning]), cross])
        global_context = torch.cat([global_context, global_context])
    else:
        assert all(c.uncond_cross_context is None for c in conditioning)
    assert len(captured) == case["num_steps"]
    torch.testing.assert_close(cross, captured[0]["encoder_hidden_states"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(global_context, captured[0]["global_hidden_states"], rtol=1e-5, atol=1e-6)

    assert reference.shape[0] == len(ours)
    for waveform, expected in zip(ours, reference, strict=True):
        assert waveform.shape == expected.shape
        assert waveform.shape[-1] == int(case["end_s"] * 44100) - int(case["start_s"] * 44100)
        assert expected.abs().max() > 0
        torch.testing.assert_close(waveform, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))

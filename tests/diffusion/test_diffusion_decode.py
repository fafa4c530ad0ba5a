"""Decoding only the requested span (plus margin) gives the samples of a full-window decode."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from diffusers import AutoencoderOobleck

from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec, SampleState


@pytest.mark.parametrize(("start_s", "end_s"), [(0.0, 0.4), (1.0, 2.5), (4.0, 5.9)])
def test_span_decode_equals_full_decode(tiny_models, start_s, end_s):
    # The released decoder's strides, kernels and dilations (its receptive field), with few channels.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        vae = AutoencoderOobleck(
            encoder_hidden_size=4, downsampling_ratios=[2, 4, 4, 8, 8], channel_multiples=[1, 2, 4, 8, 16],
            decoder_channels=2, decoder_input_channels=tiny_models.num_latent_channels,
        ).eval()
    models = dataclasses.replace(tiny_models, vae=vae)
    assert models.max_duration_s == pytest.approx(128 * 2048 / 44100)
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(models.num_latent_channels, models.num_latent_frames, generator=generator)
    spec = SampleSpec("x", None, start_s, end_s, 1.0, num_steps=1, seed=0)
    state = SampleState(spec, None, None, None, latents, latents, step_index=1)
    ours = DiffusionRunner(models).decode(state)
    with torch.inference_mode():
        full = vae.decode(latents[None]).sample[0]
    expected = full[:, int(start_s * 44100) : int(end_s * 44100)]
    assert ours.shape == expected.shape
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6 * float(expected.abs().max()))

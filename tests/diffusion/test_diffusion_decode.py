"""Decoding only the requested span (plus margin) gives the samples of a full-window decode; int16 output is what a
16-bit file's encoder makes of the float samples."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from diffusers import AutoencoderOobleck

from chorus.diffusion.engine.request import AudioOutput, SampleFormat
from chorus.diffusion.engine.runner import (
    DECODE_MARGIN_FRAMES,
    S16_MAX,
    DiffusionRunner,
    SampleSpec,
    SampleState,
    to_s16,
)
from chorus.gateway.audio.encoder import _s16le


@pytest.mark.parametrize(("start_s", "end_s"), [(0.0, 0.4), (1.0, 2.5), (4.0, 5.9)])
def test_span_decode_equals_full_decode(tiny_models, start_s, end_s):
    # The released decoder's strides, kernels and dilations (its receptive field), with few channels.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        vae = AutoencoderOobleck(
            encoder_hidden_size=4,
            downsampling_ratios=[2, 4, 4, 8, 8],
            channel_multiples=[1, 2, 4, 8, 16],
            decoder_channels=2,
            decoder_input_channels=tiny_models.num_latent_channels,
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


def test_waveform_is_interleaved_in_memory_with_the_decoders_samples(tiny_models, monkeypatch):
    """The runner transposes on the device so the host sends its memory as is: same samples, same wire bytes as
    the (channels, samples) row-major waveform it returned before, interleaved on the host."""
    decoded = []
    vae_decode = tiny_models.vae.decode

    def recording_decode(latents):
        output = vae_decode(latents)
        decoded.append(output.sample[0])
        return output

    monkeypatch.setattr(tiny_models.vae, "decode", recording_decode)
    generator = torch.Generator().manual_seed(2)
    latents = torch.randn(tiny_models.num_latent_channels, tiny_models.num_latent_frames, generator=generator)
    spec = SampleSpec("x", None, 0.1, 0.6, 1.0, num_steps=1, seed=0)
    state = SampleState(spec, None, None, None, latents, latents, step_index=1)
    ours = DiffusionRunner(tiny_models).decode(state)
    assert ours.stride() == (1, 2)
    first_sample = int(0.1 * 44100)
    offset = max(0, first_sample // tiny_models.hop_samples - DECODE_MARGIN_FRAMES) * tiny_models.hop_samples
    before = decoded[0][:, first_sample - offset : first_sample - offset + ours.shape[1]].contiguous()
    assert torch.equal(ours, before)
    interleaved_before = np.ascontiguousarray(before.numpy().T, dtype="<f4").tobytes()
    assert AudioOutput(0, ours, 44100).interleaved_bytes() == interleaved_before


def test_int16_waveform_is_the_float_one_as_a_16_bit_file_holds_it(tiny_models):
    """Asked for int16, the runner converts on the device exactly as the gateway's wav/pcm encoder converts the float
    samples: same bytes, interleaved in memory as the float waveform."""
    generator = torch.Generator().manual_seed(3)
    latents = 4 * torch.randn(tiny_models.num_latent_channels, tiny_models.num_latent_frames, generator=generator)
    spec = SampleSpec("x", None, 0.0, 0.6, 1.0, num_steps=1, seed=0)
    state = SampleState(spec, None, None, None, latents, latents, step_index=1)
    runner = DiffusionRunner(tiny_models)
    floats, ints = runner.decode(state), runner.decode(state, SampleFormat.S16)
    assert ints.dtype == torch.int16 and ints.shape == floats.shape and ints.stride() == (1, 2)
    assert AudioOutput(0, ints, 44100).interleaved_bytes() == _s16le(floats.numpy().T)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_to_s16_converts_as_the_gateways_encoder_at_the_edges(device):
    edges = [-2.0, -1.0, -0.99999994, -1 / 32768, -0.7 / 32768, -0.0, 0.0, 0.4 / 32768, 1 / 32768, 0.5, S16_MAX,
             0.99999994, 1.0, 3.0, float("inf"), float("-inf"), 1e-40, -1e-40]  # fmt: skip
    samples = torch.tensor(edges, dtype=torch.float32)
    samples = torch.cat([samples, torch.rand(10_000, generator=torch.Generator().manual_seed(4)) * 2.4 - 1.2])
    assert to_s16(samples.to(device)).cpu().numpy().tobytes() == _s16le(samples.numpy())

"""Our DiT forward (fused attention projections, kernel choice) equals diffusers' stock forward."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers.models.embeddings import get_1d_rotary_pos_embed

from chorus.diffusion.dit import ATTENTION_BACKENDS, StableAudioDenoiser


def _inputs(models, num_rows: int):
    config = models.transformer.config
    generator = torch.Generator().manual_seed(3)
    latents = torch.randn(num_rows, models.num_latent_channels, models.num_latent_frames, generator=generator)
    cross_context = torch.randn(num_rows, 130, config.cross_attention_input_dim, generator=generator)
    global_context = torch.randn(num_rows, 1, config.global_states_input_dim, generator=generator)
    return latents, cross_context, global_context


def _stock_velocity(transformer, latents, timestep, cross_context, global_context):
    rotary = get_1d_rotary_pos_embed(
        transformer.config.attention_head_dim // 2, latents.shape[2] + 1, use_real=True, repeat_interleave_real=False
    )
    with torch.inference_mode():
        return transformer(
            latents,
            timestep.reshape(1),
            encoder_hidden_states=cross_context,
            global_hidden_states=global_context,
            rotary_embedding=rotary,
            return_dict=False,
        )[0]


@pytest.mark.parametrize("timestep", [0.03, 0.9])
def test_denoiser_matches_stock_forward(tiny_models, timestep):
    stock = copy.deepcopy(tiny_models.transformer)
    stock.set_default_attn_processor()
    denoiser = StableAudioDenoiser(tiny_models.transformer, tiny_models.time_frequencies)
    latents, cross_context, global_context = _inputs(tiny_models, num_rows=3)
    timesteps = torch.full((3,), timestep)
    ours = denoiser(latents, timesteps, cross_context, global_context)
    expected = _stock_velocity(stock, latents, timesteps[0], cross_context, global_context)
    assert ours.shape == latents.shape
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


@pytest.mark.parametrize("attention_backend", sorted(set(ATTENTION_BACKENDS) - {"auto"}))
def test_attention_backend_keeps_results(tiny_models, attention_backend):
    """On CPU every list falls through to a CPU kernel; this checks the kernel scope around the blocks."""
    inputs = _inputs(tiny_models, num_rows=2)
    timesteps = torch.tensor([0.2, 0.7])
    auto = StableAudioDenoiser(tiny_models.transformer, tiny_models.time_frequencies)
    chosen = StableAudioDenoiser(
        tiny_models.transformer, tiny_models.time_frequencies, attention_backend=attention_backend
    )
    expected = auto(inputs[0], timesteps, *inputs[1:])
    torch.testing.assert_close(chosen(inputs[0], timesteps, *inputs[1:]), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("field, value", [("compile_mode", "max-autotune"), ("attention_backend", "fastest")])
def test_unknown_options_name_the_field(tiny_models, field, value):
    with pytest.raises(ValueError, match=field):
        StableAudioDenoiser(tiny_models.transformer, tiny_models.time_frequencies, **{field: value})

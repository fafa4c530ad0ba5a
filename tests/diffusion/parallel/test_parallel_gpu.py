"""On two GPUs (NCCL), each parallel mode computes what one GPU does, within half-precision tolerance."""

from __future__ import annotations

import pytest
import torch

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.loader import load_models
from chorus.diffusion.parallel.group import ParallelGroup

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]


def specs_within(window_s: float) -> list[SampleSpec]:
    """Two samples inside the model's window (the tiny preset's is under a second)."""
    return [
        SampleSpec("rain on a tin roof", None, 0.0, 0.6 * window_s, guidance_scale=7.0, num_steps=8, seed=1),
        SampleSpec("a dog barks", "noise", 0.2 * window_s, 0.5 * window_s, guidance_scale=1.0, num_steps=6, seed=2),
    ]


@pytest.mark.parametrize("parallel", ["cfg", "tp", "sp"])
@pytest.mark.parametrize(("model", "load_format"), [("tiny", "auto"), ("stable-audio-open-1.0", "dummy")])
def test_parallel_matches_one_gpu(parallel: str, model: str, load_format: str) -> None:
    single = load_models(model, load_format, device="cuda:0", dtype="bfloat16", seed=0)
    generator = torch.Generator(device="cuda:0").manual_seed(5)
    model_config = single.transformer.config
    num_cross_tokens = single.tokenizer.model_max_length + 2
    inputs = (
        torch.randn(3, single.num_latent_channels, single.num_latent_frames, generator=generator, device="cuda:0"),
        torch.rand(3, generator=generator, device="cuda:0"),
        torch.randn(3, num_cross_tokens, model_config.cross_attention_input_dim, generator=generator, device="cuda:0"),
        torch.randn(3, 1, model_config.global_states_input_dim, generator=generator, device="cuda:0"),
    )
    expected = StableAudioDenoiser(single.transformer, single.time_frequencies)(*inputs).float()
    specs = specs_within(min(single.max_duration_s, 5.0))
    expected_audio = DiffusionRunner(single).generate(specs)
    del single

    config = DiffusionConfig(
        model=model, load_format=load_format, device="cuda", dtype="bfloat16", parallel=parallel, parallel_degree=2
    )
    models = load_models(model, load_format, device="cuda:0", dtype="bfloat16", seed=0)
    group = ParallelGroup.launch(config, models)
    try:
        actual = group.denoiser(*inputs).float()
        actual_audio = DiffusionRunner(models, denoiser=group.denoiser).generate(specs)
    finally:
        group.close()
    scale = expected.abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=0, atol=2e-2 * scale)
    for got, want in zip(actual_audio, expected_audio, strict=True):
        # Sampling amplifies bf16 rounding differences over the steps; the waveforms stay close, not equal.
        error = (got - want).norm() / want.norm()
        assert error < 0.1, f"relative error {error:.3f}"

"""A parallel group on CPU (gloo, tiny model, real worker processes) computes what one process does."""

from __future__ import annotations

import pytest
import torch

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.loader import StableAudioModels, load_models
from chorus.diffusion.parallel.group import ParallelGroup


def _inputs(models: StableAudioModels, num_rows: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(3)
    model_config = models.transformer.config
    num_cross_tokens = models.tokenizer.model_max_length + 2
    return (
        torch.randn(num_rows, models.num_latent_channels, models.num_latent_frames, generator=generator),
        torch.rand(num_rows, generator=generator),
        torch.randn(num_rows, num_cross_tokens, model_config.cross_attention_input_dim, generator=generator),
        torch.randn(num_rows, 1, model_config.global_states_input_dim, generator=generator),
    )


SPECS = [
    SampleSpec("rain on a tin roof", None, 0.0, 1.0, guidance_scale=7.0, num_steps=3, seed=1),
    SampleSpec("a dog barks", "noise", 0.2, 0.9, guidance_scale=1.0, num_steps=2, seed=2),
]


@pytest.mark.parametrize(("parallel", "degree"), [("cfg", 2), ("tp", 2), ("sp", 2)])
def test_parallel_matches_one_process(tiny_models: StableAudioModels, parallel: str, degree: int) -> None:
    expected_denoiser = StableAudioDenoiser(tiny_models.transformer, tiny_models.time_frequencies)
    # Odd row counts make CFG groups pad rows; the tiny sequence (1 + latent frames) is odd, so sp pads a token.
    inputs = [_inputs(tiny_models, num_rows) for num_rows in (3, 1)]
    expected = [expected_denoiser(*x) for x in inputs]
    expected_audio = DiffusionRunner(tiny_models).generate(SPECS)

    config = DiffusionConfig(model="tiny", device="cpu", dtype="float32", parallel=parallel, parallel_degree=degree)
    models = load_models("tiny", device="cpu", dtype="float32", seed=0)
    group = ParallelGroup.launch(config, models)
    try:
        actual = [group.denoiser(*x) for x in inputs]
        actual_audio = DiffusionRunner(models, denoiser=group.denoiser).generate(SPECS)
    finally:
        group.close()
    for got, want in zip(actual, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for got, want in zip(actual_audio, expected_audio, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert all(worker.returncode == 0 for worker in group.workers)

"""CUDA-graph replay of the DiT equals the eager forward (GPU only), and the bucket policy (CPU)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine import AudioOutput, DiffusionEngine, validate_request
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.graphs import GraphedDenoiser, row_buckets
from chorus.diffusion.loader import load_models


def test_row_buckets():
    assert row_buckets(1) == [1]
    assert row_buckets(16) == [1, 2, 4, 8, 16]
    assert row_buckets(12) == [1, 2, 4, 8, 12]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_graph_replay_equals_eager(dtype):
    models = load_models("tiny", device="cuda", dtype=dtype)
    eager = StableAudioDenoiser(models.transformer, models.time_frequencies)
    graphed = GraphedDenoiser(eager, num_cross_tokens=130, latent_shape=(8, 128))
    graphed.capture(max_rows=8)
    assert graphed.captured_buckets == [1, 2, 4, 8]
    generator = torch.Generator("cuda").manual_seed(0)
    tolerance = {"rtol": 2e-3, "atol": 2e-3} if dtype == "float32" else {"rtol": 2e-2, "atol": 2e-2}
    for rows in (1, 3, 8, 9):
        inputs = (
            torch.randn(rows, 8, 128, device="cuda", generator=generator),
            torch.rand(rows, device="cuda", generator=generator),
            torch.randn(rows, 130, 16, device="cuda", generator=generator),
            torch.randn(rows, 1, 32, device="cuda", generator=generator),
        )
        with torch.inference_mode():
            torch.testing.assert_close(graphed(*inputs), eager(*inputs), **tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("compile_dit", [False, True], ids=["eager_blocks", "compiled_blocks"])
def test_graphed_runner_matches_eager_runner(compile_dit):
    models = load_models("tiny", device="cuda", dtype="float32")
    specs = [SampleSpec("rain", None, 0.0, 0.5, 7.0, 6, 1), SampleSpec("bell", "hiss", 0.1, 0.3, 2.0, 4, 2)]
    graphed = DiffusionRunner(models, max_graph_rows=4, compile_dit=compile_dit).generate(specs)
    eager = DiffusionRunner(models).generate(specs)
    for ours, expected in zip(graphed, eager, strict=True):
        torch.testing.assert_close(ours, expected, rtol=1e-3, atol=1e-3 * float(expected.abs().max()))


@pytest.mark.gpu
@pytest.mark.parametrize("attention_backend", ["flash", "cudnn"])
def test_compiled_graphs_with_attention_backend_match_eager_runner(attention_backend):
    """fp16, where the cuDNN and flash kernels apply: the kernel order reaches the compiled, captured blocks."""
    models = load_models("tiny", device="cuda", dtype="float16")
    specs = [SampleSpec("rain", None, 0.0, 0.5, 7.0, 6, 1), SampleSpec("bell", "hiss", 0.1, 0.3, 2.0, 4, 2)]
    runner = DiffusionRunner(models, max_graph_rows=4, compile_dit=True, attention_backend=attention_backend)
    ours = runner.generate(specs)
    eager = DiffusionRunner(models).generate(specs)
    for waveform, expected in zip(ours, eager, strict=True):
        assert bool(waveform.isfinite().all())
        torch.testing.assert_close(waveform, expected, rtol=2e-2, atol=2e-2 * float(expected.abs().max()))


@pytest.mark.gpu
async def test_fp16_engine_on_cuda_is_finite_and_batch_independent():
    models = load_models("tiny", device="cuda", dtype="float16")
    engine = DiffusionEngine(models, max_batch_size=4, batch_window_ms=200)
    assert engine.runner.denoiser.captured_buckets == [1, 2, 4, 8]
    engine.start()
    try:

        def request(request_id, seed):
            return validate_request(
                engine.limits, request_id=request_id, prompt="rain", duration_s=0.5, num_steps=8, seed=seed
            )

        async def audio(request):
            (waveform,) = [e.waveform async for e in engine.generate(request) if isinstance(e, AudioOutput)]
            return waveform

        alone = await audio(request("alone", 3))
        together = await asyncio.gather(*(audio(request(f"r{seed}", seed)) for seed in (1, 2, 3)))
    finally:
        engine.stop()
    assert alone.shape == (2, 22050) and bool(alone.isfinite().all())
    torch.testing.assert_close(together[2], alone, rtol=2e-2, atol=2e-2 * float(alone.abs().max()))

"""Benchmark: the diffusion engine against diffusers' StableAudioPipeline, same weights, same run.

    python -m chorus.diffusion.bench                # on a GPU: released shapes, dummy weights, fp16
    python -m chorus.diffusion.bench --preset tiny --device cpu --dtype float32 --num-steps 3   # smoke run

Measures, with 100 steps and guidance 7 by default (a negative prompt on every request, as the baseline):
- ours: latency of one request, and wall time for N concurrent requests through the batching window;
- pipeline: one call for one prompt, N calls one after the other, and one call with all N prompts.
Our latency is submit → Finished: the batching window, text encoding, sampling and the VAE decode. Writes
bench/results/diffusion-<time>.json and .png (bars, left to right: one request ours / pipeline, then
N concurrent ours / pipeline one call per request / pipeline one call with all N prompts).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from chorus.bench.report import commit
from chorus.diffusion.bench_plot import write_bar_chart
from chorus.diffusion.dit import ATTENTION_BACKENDS, COMPILE_MODES
from chorus.diffusion.engine.engine import DiffusionEngine, StepStats
from chorus.diffusion.engine.request import Finished, FinishReason, validate_request
from chorus.diffusion.loader import StableAudioModels, load_models
from chorus.diffusion.presets import SCHEDULER_CONFIG

PROMPTS = [
    "A danceable electronic track in the genre of dance.",
    "Rain on a tin roof with distant thunder.",
    "A solo acoustic guitar playing a slow folk melody.",
    "Birds singing in a forest at dawn.",
    "A jazz drum groove with brushes, 90 BPM.",
    "Ocean waves crashing on a rocky shore.",
    "An ambient synth pad slowly evolving.",
    "A busy city street with car horns and footsteps.",
]
NEGATIVE_PROMPT = "Low quality, noisy"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


async def run_requests(engine: DiffusionEngine, args: argparse.Namespace, num_requests: int, tag: str) -> float:
    """Submits `num_requests` at once and returns the wall seconds until the last one finishes."""

    async def one(index: int) -> None:
        request = validate_request(
            engine.limits,
            request_id=f"{tag}-{index}",
            prompt=PROMPTS[index % len(PROMPTS)],
            negative_prompt=NEGATIVE_PROMPT,
            duration_s=args.duration_s,
            num_steps=args.num_steps,
            guidance_scale=args.guidance_scale,
            seed=index,
        )
        async for event in engine.generate(request):
            if isinstance(event, Finished) and event.reason is not FinishReason.COMPLETE:
                raise RuntimeError(f"request {request.request_id} ended {event.reason}: {event.error_message}")

    started_s = time.perf_counter()
    await asyncio.gather(*(one(index) for index in range(num_requests)))
    return time.perf_counter() - started_s


def _reference_pipeline(models: StableAudioModels):
    """StableAudioPipeline on the same DiT and VAE; T5 and the projection copied to the DiT dtype, because
    the stock pipeline runs everything in one dtype."""
    from diffusers import CosineDPMSolverMultistepScheduler, StableAudioPipeline

    return StableAudioPipeline(
        vae=models.vae,
        text_encoder=copy.deepcopy(models.text_encoder).to(models.dtype),
        projection_model=copy.deepcopy(models.projection_model).to(models.dtype),
        tokenizer=models.tokenizer,
        transformer=models.transformer,
        scheduler=CosineDPMSolverMultistepScheduler.from_config(SCHEDULER_CONFIG),
    )


def _run_pipeline(pipe, args: argparse.Namespace, prompts: list[str], num_steps: int) -> float:
    device = pipe.transformer.device
    generators = [torch.Generator(device).manual_seed(index) for index in range(len(prompts))]
    _synchronize(device)
    started_s = time.perf_counter()
    pipe(
        prompts,
        negative_prompt=[NEGATIVE_PROMPT] * len(prompts),
        num_inference_steps=num_steps,
        guidance_scale=args.guidance_scale,
        audio_end_in_s=args.duration_s,
        generator=generators,
        output_type="pt",
    )
    _synchronize(device)
    return time.perf_counter() - started_s


def _measure(args: argparse.Namespace) -> dict:
    models = load_models(
        args.preset, load_format="dummy" if args.preset == "dummy" else "auto", device=args.device, dtype=args.dtype
    )
    # Recorded in the JSON settings as run: the tiny preset's window is shorter than the default 10 s.
    args.duration_s = min(args.duration_s, models.max_duration_s)
    num_concurrent = args.num_concurrent
    results: dict = {}

    step_ms_by_samples: dict[int, list[float]] = {}

    def record_step(stats: StepStats) -> None:
        step_ms_by_samples.setdefault(stats.num_samples, []).append(stats.step_time_s * 1000)

    async def ours() -> None:
        engine = DiffusionEngine(
            models,
            max_batch_size=num_concurrent,
            batch_window_ms=args.batch_window_ms,
            use_cuda_graphs=not args.no_cuda_graphs,
            compile_dit=args.compile,
            compile_mode=args.compile_mode,
            attention_backend=args.attention_backend,
            on_step=record_step,
        )
        engine.start()
        try:
            await run_requests(engine, args, num_concurrent, "warmup")
            step_ms_by_samples.clear()
            single = [await run_requests(engine, args, 1, f"single{i}") for i in range(args.repeats)]
            concurrent = [await run_requests(engine, args, num_concurrent, f"batch{i}") for i in range(args.repeats)]
        finally:
            engine.stop()
        results["ours_one_request_s"] = statistics.median(single)
        results["ours_concurrent_s"] = statistics.median(concurrent)
        results["ours_runs_s"] = {"one_request": single, "concurrent": concurrent}
        # Host time per engine step; without host syncs it settles at the GPU step time.
        results["ours_step_ms_median_by_batch_samples"] = {
            samples: statistics.median(times) for samples, times in sorted(step_ms_by_samples.items())
        }

    asyncio.run(ours())
    if not args.skip_pipeline:
        # The stock pipeline runs stock code: undo our self-attention processor on the shared DiT.
        models.transformer.set_default_attn_processor()
        pipe = _reference_pipeline(models)
        pipe.set_progress_bar_config(disable=True)
        _run_pipeline(pipe, args, PROMPTS[:1], num_steps=min(5, args.num_steps))
        results["pipeline_one_request_s"] = _run_pipeline(pipe, args, PROMPTS[:1], args.num_steps)
        prompts = [PROMPTS[index % len(PROMPTS)] for index in range(num_concurrent)]
        one_by_one = [_run_pipeline(pipe, args, [prompt], args.num_steps) for prompt in prompts]
        results["pipeline_one_call_per_request_s"] = sum(one_by_one)
        results["pipeline_one_call_all_prompts_s"] = _run_pipeline(pipe, args, prompts, args.num_steps)
        results["speedup_one_request"] = results["pipeline_one_request_s"] / results["ours_one_request_s"]
        results["speedup_concurrent_vs_one_call"] = (
            results["pipeline_one_call_all_prompts_s"] / results["ours_concurrent_s"]
        )
    if models.device.type == "cuda":
        results["peak_memory_gib"] = torch.cuda.max_memory_allocated(models.device) / 2**30
        results["device_name"] = torch.cuda.get_device_name(models.device)
    else:
        results["device_name"] = platform.processor() or "cpu"
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="dummy", help="dummy (released shapes) or tiny, or a model directory")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--num-steps", type=int, default=100)
    parser.add_argument("--guidance-scale", type=float, default=7.0)
    parser.add_argument("--duration-s", type=float, default=10.0, help="clamped to the model's window")
    parser.add_argument("--num-concurrent", type=int, default=8)
    parser.add_argument("--batch-window-ms", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each of our measurements (median)")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the DiT forward (CUDA graphs on)")
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES, help="with --compile")
    parser.add_argument(
        "--attention-backend",
        default="auto",
        choices=sorted(ATTENTION_BACKENDS),
        help="SDPA kernel order of the DiT (auto: PyTorch's choice)",
    )
    parser.add_argument("--skip-pipeline", action="store_true", help="leave out StableAudioPipeline")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)

    started_s = time.perf_counter()
    results = _measure(args)
    report = {
        "benchmark": "diffusion",
        "commit": commit(),
        "settings": vars(args),
        "torch": torch.__version__,
        "results": results,
        "total_s": time.perf_counter() - started_s,
    }
    print(json.dumps(report, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"diffusion-{stamp}.json").write_text(json.dumps(report, indent=2))
    groups = [[(results["ours_one_request_s"], 0)], [(results["ours_concurrent_s"], 0)]]
    if not args.skip_pipeline:
        groups[0].append((results["pipeline_one_request_s"], 1))
        groups[1] += [(results["pipeline_one_call_per_request_s"], 1), (results["pipeline_one_call_all_prompts_s"], 2)]
    write_bar_chart(out / f"diffusion-{stamp}.png", groups)
    print(f"wrote {out / f'diffusion-{stamp}.json'} and .png")
    return report


if __name__ == "__main__":
    main()

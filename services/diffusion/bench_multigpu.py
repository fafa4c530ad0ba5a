"""Benchmark of one Stable Audio Open model over several GPUs (chorus.diffusion.parallel) against replicas.

    python -m chorus.diffusion.bench_multigpu [--quick] [--out bench/results]

Released shapes with dummy weights, 100 steps, guidance 7, 10 s. For one GPU and each parallel mode at
degree 2 (and 4 where the host has 4 GPUs): the latency of one request and the wall time of 8 concurrent
requests through the engine (batched as the service batches them). Replicas, one independent model per GPU
with the 8 requests split across them, are the throughput reference. The 1-GPU row, the replicas and the
cfg ranks replay CUDA graphs unless --no-cuda-graphs (tp and sp ranks run eagerly); --compile compiles the
DiT blocks of all of them, so every row runs the same kernels.
Writes multigpu-<stamp>.json and .png (per configuration: one request, then 8 concurrent) into --out.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from chorus.bench.report import commit
from chorus.diffusion.bench import run_requests
from chorus.diffusion.bench_plot import write_bar_chart
from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.dit import ATTENTION_BACKENDS
from chorus.diffusion.engine.engine import DiffusionEngine
from chorus.diffusion.loader import load_models
from chorus.diffusion.parallel.group import ParallelGroup, rank_device


def default_configurations(num_gpus: int) -> list[tuple[str, int]]:
    """(mode, degree) pairs to measure on a host with `num_gpus` GPUs, the 1-GPU baseline first."""
    configurations = [("none", 1)]
    if num_gpus >= 2:
        configurations += [("cfg", 2), ("tp", 2), ("sp", 2)]
    if num_gpus >= 4:
        # CFG-parallel stops at 2 (a conditional and an unconditional half); beyond, it pairs with tp or sp.
        configurations += [("tp", 4), ("sp", 4), ("cfg+tp", 4), ("cfg+sp", 4)]
    return configurations


def _log(message: str) -> None:
    print(f"[bench_multigpu {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _model_args(args: argparse.Namespace) -> dict:
    return {"model": args.preset, "load_format": "dummy" if args.preset == "dummy" else "auto", "dtype": args.dtype}


def measure_configuration(args: argparse.Namespace, mode: str, degree: int) -> dict:
    """One request, then `num_concurrent` requests at once, `repeats` times each (medians)."""
    config = DiffusionConfig(
        device=args.device,
        parallel=mode,
        parallel_degree=degree,
        max_batch_size=args.num_concurrent,
        batch_window_ms=args.batch_window_ms,
        use_cuda_graphs=not args.no_cuda_graphs,
        compile_dit=args.compile,
        attention_backend=args.attention_backend,
        **_model_args(args),
    )
    device = rank_device(args.device, 0)
    models = load_models(config.model, config.load_format, str(device), config.dtype)
    args.duration_s = min(args.duration_s, models.max_duration_s)
    group = ParallelGroup.launch(config, models) if mode != "none" else None
    engine = DiffusionEngine(
        models,
        max_batch_size=config.max_batch_size,
        batch_window_ms=config.batch_window_ms,
        use_cuda_graphs=config.use_cuda_graphs,
        compile_dit=config.compile_dit,
        attention_backend=config.attention_backend,
        denoiser=group.denoiser if group else None,
    )
    engine.start()

    async def run(engine: DiffusionEngine) -> dict:
        await run_requests(engine, _warmup_args(args), args.num_concurrent, "warmup")
        single = [await run_requests(engine, args, 1, f"one{i}") for i in range(args.repeats)]
        concurrent = [await run_requests(engine, args, args.num_concurrent, f"many{i}") for i in range(args.repeats)]
        return {
            "one_request_s": statistics.median(single),
            "concurrent_s": statistics.median(concurrent),
            "runs_s": {"one_request": single, "concurrent": concurrent},
        }

    try:
        result = asyncio.run(run(engine))
    finally:
        engine.stop()
        if group is not None:
            group.close()
    return {"mode": mode, "degree": degree, **result}


def _warmup_args(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "num_steps": min(args.num_steps, 5)})


def measure_replicas(args: argparse.Namespace, num_replicas: int) -> dict:
    """Wall time of `num_concurrent` requests split over `num_replicas` independent processes, one per GPU,
    each loaded and warmed up before any starts."""
    shares = [len(range(index, args.num_concurrent, num_replicas)) for index in range(num_replicas)]
    replica_argv = [
        "--preset",
        args.preset,
        "--dtype",
        args.dtype,
        "--num-steps",
        str(args.num_steps),
        "--guidance-scale",
        str(args.guidance_scale),
        "--duration-s",
        str(args.duration_s),
        "--batch-window-ms",
        str(args.batch_window_ms),
        "--attention-backend",
        args.attention_backend,
        *(["--no-cuda-graphs"] if args.no_cuda_graphs else []),
        *(["--compile"] if args.compile else []),
    ]
    is_cuda = rank_device(args.device, 0).type == "cuda"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu_ids = visible.split(",") if visible else [str(index) for index in range(num_replicas)]
    replicas = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "chorus.diffusion.bench_multigpu",
                *replica_argv,
                "--device",
                args.device,
                "--num-concurrent",
                str(share),
                "--replica",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            # Each replica sees only its GPU, as cuda:0, like a pod of one GPU.
            env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu_ids[index]} if is_cuda else None,
        )
        for index, share in enumerate(shares)
    ]
    try:
        for replica in replicas:
            assert replica.stdout.readline().strip() == "ready"
        for replica in replicas:
            replica.stdin.write("go\n")
            replica.stdin.flush()
        walls_s = [float(replica.stdout.readline()) for replica in replicas]
    finally:
        for replica in replicas:
            replica.kill()
            replica.wait()
    return {"mode": "replicas", "degree": num_replicas, "concurrent_s": max(walls_s), "replica_walls_s": walls_s}


def _serve_replica(args: argparse.Namespace) -> None:
    """--replica: load and warm up, print "ready", wait for "go", run the requests, print their wall time."""
    models = load_models(device=args.device, **_model_args(args))
    args.duration_s = min(args.duration_s, models.max_duration_s)
    engine = DiffusionEngine(
        models,
        max_batch_size=args.num_concurrent,
        batch_window_ms=args.batch_window_ms,
        use_cuda_graphs=not args.no_cuda_graphs,
        compile_dit=args.compile,
        attention_backend=args.attention_backend,
    )
    engine.start()
    asyncio.run(run_requests(engine, _warmup_args(args), args.num_concurrent, "warmup"))
    print("ready", flush=True)
    sys.stdin.readline()
    print(asyncio.run(run_requests(engine, args, args.num_concurrent, "replica")), flush=True)
    engine.stop()


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="dummy", help="dummy (released shapes) or tiny, or a model directory")
    parser.add_argument("--device", default="auto", help="cuda (rank r on GPU r), cpu, or auto")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--num-steps", type=int, default=100)
    parser.add_argument("--guidance-scale", type=float, default=7.0)
    parser.add_argument("--duration-s", type=float, default=10.0, help="clamped to the model's window")
    parser.add_argument("--num-concurrent", type=int, default=8)
    parser.add_argument("--batch-window-ms", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each measurement (median)")
    parser.add_argument("--quick", action="store_true", help="one run of each measurement")
    parser.add_argument("--configurations", default="", help="e.g. none:1,cfg:2,tp:4; default: all that fit")
    parser.add_argument("--replicas", default="", help="replica counts, e.g. 2,4; default: 2 and 4 that fit")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use (0: all); on CPU, the processes to use")
    parser.add_argument("--no-cuda-graphs", action="store_true", help="for every row (cfg ranks, 1 GPU, replicas)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the DiT blocks (needs CUDA graphs)")
    parser.add_argument("--attention-backend", default="auto", choices=sorted(ATTENTION_BACKENDS))
    parser.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.replica:
        _serve_replica(args)
        return None
    if args.quick:
        args.repeats = 1

    started_s = time.perf_counter()
    is_cuda = rank_device(args.device, 0).type == "cuda"
    num_gpus = args.gpus or (torch.cuda.device_count() if is_cuda else 2)
    configurations = (
        [(mode, int(degree)) for mode, degree in (item.split(":") for item in args.configurations.split(","))]
        if args.configurations
        else default_configurations(num_gpus)
    )
    replica_counts = [int(n) for n in args.replicas.split(",")] if args.replicas else [2, 4]
    replica_counts = [n for n in replica_counts if n <= num_gpus]
    results = []
    for mode, degree in configurations:
        _log(f"{mode} at degree {degree}…")
        results.append(measure_configuration(args, mode, degree))
        gc.collect()  # the configuration's models, before the next one loads
        if is_cuda:
            torch.cuda.empty_cache()
        _log(
            f"{mode}×{degree}: one request {results[-1]['one_request_s']:.2f} s, "
            f"{args.num_concurrent} concurrent {results[-1]['concurrent_s']:.2f} s"
        )
    for num_replicas in replica_counts:
        _log(f"{num_replicas} replicas…")
        results.append(measure_replicas(args, num_replicas))
        _log(f"{num_replicas} replicas: {args.num_concurrent} concurrent {results[-1]['concurrent_s']:.2f} s")

    report = {
        "benchmark": "diffusion-multigpu",
        "commit": commit(),
        "device_name": torch.cuda.get_device_name(0) if is_cuda else platform.processor() or "cpu",
        "gpu_count": torch.cuda.device_count() if is_cuda else 0,
        "torch": torch.__version__,
        "settings": vars(args),
        "results": results,
        "png_legend": "per configuration in results order: one request (blue, not for replicas), concurrent (orange)",
        "total_s": time.perf_counter() - started_s,
    }
    print(json.dumps(report, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"multigpu-{stamp}.json").write_text(json.dumps(report, indent=2))
    groups = [([(r["one_request_s"], 0)] if "one_request_s" in r else []) + [(r["concurrent_s"], 1)] for r in results]
    write_bar_chart(out / f"multigpu-{stamp}.png", groups)
    _log(f"wrote {out / f'multigpu-{stamp}.json'} and .png in {report['total_s']:.0f} s")
    return report


if __name__ == "__main__":
    main()

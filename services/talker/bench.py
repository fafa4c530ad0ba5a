"""Talker benchmark: `python -m chorus.talker.bench` (released 0.6B shapes, dummy weights, bf16 by default).

Per batch size (1 / 16 / 64 by default) it runs that many concurrent requests of a fixed number of frames
(125 = 10 s of audio, EOS ignored) through the engine and reports ms per frame step (one step = one frame for
every live request), RTF (request latency / audio seconds), audio seconds per wall second and peak GPU memory.
In the same run it executes the reference-style decode loop (`tools/baselines/talker_baseline.py`: Hugging Face
modules, dynamic cache, one code-predictor generate per frame) as a subprocess and puts both side by side.
Writes JSON and a PNG (audio-s/s per batch: ours blue, reference-style grey) to `bench/results/talker-*`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from chorus.bench.report import checked, commit
from chorus.bench_png import write_grouped_bars
from chorus.talker.engine.engine import FRAME_RATE_HZ, EngineConfig, TalkerEngine
from chorus.talker.loader import RELEASED_CONFIGS, build_talker
from chorus.talker.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]
# The shared tools sit beside the checkout here and inside it on the GPU machine, where the package may be
# installed outside the checkout (run from its root).
BASELINE_SCRIPT = next(
    (
        root / "shared/tools/baselines/talker_baseline.py"
        for root in (REPO, REPO.parent, Path.cwd())
        if (root / "shared/tools/baselines/talker_baseline.py").exists()
    ),
    REPO.parent / "shared/tools/baselines/talker_baseline.py",
)
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _voice(engine: TalkerEngine, voice_clone: bool):
    """A named speaker, or an x-vector voice clone (a Base checkpoint's mode, the one the peers batch)."""
    if voice_clone:
        vector = torch.randn(engine.model_config.talker.hidden_size, generator=torch.Generator().manual_seed(5))
        return engine.voice_request("voice_clone", TEXT, speaker_vector=vector, language="english")
    return engine.voice_request("custom_voice", TEXT, speaker="ryan", language="english")


def _run_batch(engine: TalkerEngine, batch_size: int, num_frames: int, tag: str, voice_clone: bool) -> dict:
    voice = _voice(engine, voice_clone)
    device = engine.runner.device
    _sync(device)
    started = time.perf_counter()
    streams = [
        engine.submit(f"{tag}-{i}", voice, SamplingParams(seed=i), max_frames=num_frames, ignore_eos=True)
        for i in range(batch_size)
    ]
    steps_before, step_ms_before = engine.stats.steps, engine.stats.step_ms_total
    engine.run_until_idle()
    _sync(device)
    wall_s = time.perf_counter() - started
    frames = [stream.collect() for stream in streams]
    assert all(len(f) == num_frames for f in frames), "every request runs to the fixed frame count"
    steps = engine.stats.steps - steps_before
    step_ms = (engine.stats.step_ms_total - step_ms_before) / max(steps, 1)
    audio_s = num_frames / FRAME_RATE_HZ
    return {
        "batch_size": batch_size,
        "ms_per_frame_step": round(step_ms, 3),
        "wall_s": round(wall_s, 3),
        "rtf": round(wall_s / audio_s, 4),
        "audio_s_per_s": round(batch_size * audio_s / wall_s, 1),
    }


def measure_ours(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> list[dict]:
    with tempfile.TemporaryDirectory() as workdir:
        load_format = "dummy" if args.size in RELEASED_CONFIGS else "auto"
        loaded = build_talker(args.size, load_format, device, dtype, Path(workdir))
    results = []
    for batch_size in args.batch_sizes:
        config = EngineConfig(
            max_streams=batch_size,
            max_positions=args.frames + 128,
            max_frames=args.frames,
            max_buffered_frames=args.frames,
            max_prefills_per_step=batch_size,
            use_cuda_graphs=not args.eager,
            compile_step=not args.no_compile,
            few_rows_matmul=not args.no_few_rows_matmul,
        )
        engine = TalkerEngine(loaded, config)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        _run_batch(engine, batch_size, min(args.frames, 8), "warmup", args.voice_clone)  # graphs, allocator
        result = _run_batch(engine, batch_size, args.frames, "run", args.voice_clone)
        if device.type == "cuda":
            result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if engine.runner.graphs is not None:
                engine.runner.graphs.release()
        print(f"ours batch {batch_size}: {result}", flush=True)
        results.append(result)
        del engine
    return results


def measure_reference(script: Path) -> dict:
    """The reference-style loop in a subprocess on the same machine (its own batch sizes 1 / 16 / 64)."""
    with tempfile.TemporaryDirectory() as out:
        env = os.environ | {"OUT": out}
        completed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=3600)
        if completed.returncode != 0:
            return {"error": completed.stderr[-2000:]}
        return json.loads((Path(out) / "talker_baseline.json").read_text())


TARGETS = (  # issue 18's for the 0.6B engine on one H100: (batch size, metric, bound, kind)
    (1, "ms_per_frame_step", 3.5, "max"),
    (64, "audio_s_per_s", 1200.0, "min"),
)


def check_targets(ours: list[dict]) -> list[dict]:
    """Each target against the measured batch size it names (none when that batch size was not run)."""
    checks = []
    for batch_size, metric, bound, kind in TARGETS:
        for row in (row for row in ours if row["batch_size"] == batch_size):
            value, met = checked(row, (metric,), bound, kind)
            checks.append({"batch_size": batch_size, "metric": metric, "value": value, "bound": bound, "kind": kind,
                           "met": met})  # fmt: skip
    return checks


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m chorus.talker.bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--size",
        default="0.6b",
        help="0.6b or 1.7b (dummy weights), tiny, or a checkpoint folder (random weights "
        "written by bench/peers/write_checkpoint.py: the peers' checkpoint)",
    )
    parser.add_argument("--voice-clone", action="store_true", help="x-vector voice-clone requests (Base checkpoints)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--batch-sizes", default="1,16,64", type=lambda text: [int(v) for v in text.split(",")])
    parser.add_argument("--frames", type=int, default=125, help="frames per request (EOS ignored)")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile of the decode step")
    parser.add_argument(
        "--no-few-rows-matmul", action="store_true", help="cuBLAS and compiled code at every batch (no few_rows_matmul)"
    )
    parser.add_argument("--reference-script", type=Path, default=BASELINE_SCRIPT)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    ours = measure_ours(args, device, dtype)
    reference = {} if args.skip_reference else measure_reference(args.reference_script)
    report = {
        "benchmark": "talker",
        "commit": commit(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "settings": {
            "size": args.size,
            "requests": "x-vector voice clone" if args.voice_clone else "custom voice",
            "dtype": args.dtype,
            "frames_per_request": args.frames,
            "cuda_graphs": not args.eager and device.type == "cuda",
            "compiled_step": not args.no_compile and device.type == "cuda",
            "few_rows_matmul": not args.no_few_rows_matmul and not args.no_compile and device.type == "cuda",
            "weights": "dummy (random)",
        },
        "ours": ours,
        "reference_style": reference,
        "targets": check_targets(ours) if args.size == "0.6b" else [],
    }
    for row in ours:
        key = f"eager_b{row['batch_size']}_audio_s_per_s"
        if key in reference:
            row["speedup_vs_reference"] = round(row["audio_s_per_s"] / reference[key], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"talker-{stamp}.json").write_text(json.dumps(report, indent=2))
    pairs = [(row["audio_s_per_s"], reference.get(f"eager_b{row['batch_size']}_audio_s_per_s", 0.0)) for row in ours]
    write_grouped_bars(args.out / f"talker-{stamp}.png", pairs)
    print(json.dumps(report, indent=2))
    print(f"wrote {args.out / f'talker-{stamp}.json'} and .png")
    return report


if __name__ == "__main__":
    main()

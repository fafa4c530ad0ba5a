"""`python bench/talker_burst_probe.py` on a GPU: where a burst of new requests spends its time to first frame.

An experiment kept for its answer, not a serving path. It builds the talker engine as `chorus serve talker` does on
CUDA (released 0.6B shapes, dummy weights, bf16, 256 slots, compiled step, graphs, warm-up), runs its thread, and
submits N requests at once (125 frames each). Per burst it reports each request's time from submit to first frame
(p50 / p95 / max), and how the engine thread spent that time: prompt building, prompt embedding, the prefill
forward (host time of the call, and its GPU time measured alone afterwards), decode launches and collects. With
`--prefill-rows 64` the prefill row buckets reach 64 and a step prefills up to 64 requests (the default: 16).
Writes `bench/results/talker-burst-<stamp>.json`.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from chorus.bench.report import REPO, commit
from chorus.talker.engine import engine as engine_module
from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.engine.prefill import row_buckets
from chorus.talker.loader import build_talker
from chorus.talker.sampling import SamplingParams

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet forest."
FRAMES = 125
_COUNTERS = (collections.Counter(), collections.Counter())  # wall ms and calls per wrapped function, per burst


def _timed(owner, name: str, totals: collections.Counter, counts: collections.Counter) -> None:
    """Wrap `owner.name` so its wall time adds up in `totals[name]` (the engine thread calls it)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[name] += (time.perf_counter() - started) * 1000
            counts[name] += 1

    setattr(owner, name, wrapper)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _burst(engine: TalkerEngine, size: int, tag: str, totals: collections.Counter, counts: collections.Counter):
    voice = engine.voice_request("custom_voice", TEXT, speaker="ryan", language="english")
    totals.clear()
    counts.clear()
    steps_before, prefills_before = engine.stats.steps, engine.stats.prefills
    started = time.perf_counter()
    streams = [
        engine.submit(f"{tag}-{i}", voice, SamplingParams(seed=i), max_frames=FRAMES, ignore_eos=True)
        for i in range(size)
    ]
    frames = [stream.collect(timeout_s=120) for stream in streams]
    wall_s = time.perf_counter() - started
    assert all(len(f) == FRAMES for f in frames)
    first_ms = [(stream.first_frame_at - started) * 1000 for stream in streams]
    return {
        "requests": size,
        "first_frame_ms": {
            "p50": round(statistics.median(first_ms), 1),
            "p95": round(_percentile(first_ms, 95), 1),
            "max": round(max(first_ms), 1),
        },
        "wall_s": round(wall_s, 3),
        "audio_s_per_s": round(size * FRAMES / 12.5 / wall_s, 1),
        "steps": engine.stats.steps - steps_before,
        "prefills": engine.stats.prefills - prefills_before,
        "engine_thread_ms": {name: round(total, 1) for name, total in totals.items()},
        "calls": dict(counts),
    }


def _prefill_gpu_ms(engine: TalkerEngine, rows: int, length: int = 64, repeats: int = 20) -> float:
    """GPU time of one padded prefill forward of `rows` × `length` alone (the graph replay, nothing queued)."""
    padded = engine.runner.padded_prefill
    embeds = torch.zeros(rows, length, engine.model_config.talker.hidden_size, device="cuda", dtype=engine.runner.dtype)
    padded.run(embeds)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        padded.run(embeds)
    end.record()
    torch.cuda.synchronize()
    return round(start.elapsed_time(end) / repeats, 3)


def _measure(loaded, prefill_rows: int, bursts: list[int], device: torch.device) -> dict:
    buckets = row_buckets(prefill_rows)  # the engine's padded prefill follows `max_prefills_per_step`
    config = EngineConfig(max_streams=0, max_buffered_frames=FRAMES, max_prefills_per_step=prefill_rows,
                          use_cuda_graphs=True, compile_step=True)  # fmt: skip
    engine = TalkerEngine(loaded, config)
    warmup_started = time.perf_counter()
    engine.runner.warmup(1024 if device.type == "cuda" else 64)
    warmup_s = time.perf_counter() - warmup_started
    totals, counts = _COUNTERS
    for owner, name in (
        (engine, "_prefill"),
        (engine, "_prefill_batch"),
        (engine.runner, "prefill"),
        (engine.runner, "embed_prompts"),
        (engine.runner, "set_params"),
        (engine, "_launch"),
        (engine, "_collect"),
    ):
        _timed(owner, name, totals, counts)
    engine.start()
    try:
        _burst(engine, 8, "warmup", totals, counts)
        results = [_burst(engine, size, f"burst{size}", totals, counts) for size in bursts]
    finally:
        engine.stop()
    prefill_gpu_ms = {rows: _prefill_gpu_ms(engine, rows) for rows in buckets} if device.type == "cuda" else {}
    if engine.runner.graphs is not None:
        engine.runner.graphs.release()
    return {"prefill_rows": prefill_rows, "slots": engine.num_slots, "warmup_s": round(warmup_s, 1),
            "prefill_gpu_ms_64_positions": prefill_gpu_ms, "bursts": results}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", default="16,64,256", type=lambda text: [int(v) for v in text.split(",")])
    parser.add_argument(
        "--prefill-rows",
        default="16,64",
        type=lambda text: [int(v) for v in text.split(",")],
        help="per variant: the largest prefill row bucket and the prefills a step (the engine's default: 16)",
    )
    parser.add_argument("--size", default="0.6b", help="0.6b, 1.7b or tiny (a CPU smoke run of the probe)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with tempfile.TemporaryDirectory() as workdir:
        loaded = build_talker(args.size, "dummy" if args.size != "tiny" else "auto", device, dtype, Path(workdir))
    _timed(engine_module, "build_prompt", *_COUNTERS)
    variants = []
    for rows in args.prefill_rows:
        variants.append(_measure(loaded, rows, args.bursts, device))
        print(json.dumps(variants[-1]), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report = {
        "benchmark": "talker-burst",
        "commit": commit(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "settings": {"size": args.size, "dtype": str(dtype), "weights": "dummy", "frames": FRAMES},
        "variants": variants,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"talker-burst-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""`python -m chorus.bench.kernels`: where one talker step, one vocoder chunk and one DiT forward spend their GPU
time, per kernel.

The engines run as they serve (talker: CUDA graphs and the compiled step; vocoder: graph replays of 25-frame
chunks; diffusion: the compiled DiT's graph replay at 2 rows, one request with CFG, or more), released shapes with
dummy weights, under PyTorch's profiler, which records the kernels inside graph
replays too. Per configuration the JSON gives the wall time per step, the GPU's busy time per step (the union of
kernel intervals: what is left of the wall time is the GPU idle, waiting for launches or the host), the kernels
per step, their time by family (matmuls, attention, sorting, fused element-wise and reductions, copies, other) and
the costliest kernels by name. The PNG stacks the families per configuration in that order. Needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

from chorus.bench.report import commit
from chorus.bench_png import write_stacked_bars

FAMILIES = (  # first match wins; the order is the PNG's, bottom-up
    ("matmul", re.compile(r"gemm|gemv|matmul|nvjet|cutlass|sm\d+_xmma|splitK|ampere_|hopper_", re.I)),
    ("attention", re.compile(r"attn|attention|flash|fmha|paged", re.I)),
    ("sort_scan", re.compile(r"sort|scan|cub::|cumsum|topk|radix", re.I)),
    ("fused", re.compile(r"^triton_|rope", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy|CatArrayBatched|index_elementwise|gather|scatter", re.I)),
)
TOP_KERNELS = 25


def family(name: str) -> str:
    return next((label for label, pattern in FAMILIES if pattern.search(name)), "other")


def summarize(kernels: list[tuple[str, float, float]], steps: int, wall_ms: float) -> dict:
    """`kernels`: (name, start µs, duration µs) of every kernel in the profiled window of `steps` steps."""
    by_family = {label: 0.0 for label, _ in FAMILIES} | {"other": 0.0}
    by_name: dict[str, list[float]] = {}
    busy_us, busy_until = 0.0, float("-inf")
    for name, start, duration in sorted(kernels, key=lambda kernel: kernel[1]):
        by_family[family(name)] += duration
        entry = by_name.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += duration
        end = start + duration
        if end > busy_until:  # the union of intervals: overlapping kernels (other streams) count once
            busy_us += end - max(start, busy_until)
            busy_until = end
    per_step = 1e-3 / steps
    top = sorted(by_name.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_ms / steps, 3),
        "gpu_busy_ms_per_step": round(busy_us * per_step, 4),
        "kernel_ms_per_step": round(sum(duration for _, _, duration in kernels) * per_step, 4),
        "kernels_per_step": round(len(kernels) / steps, 1),
        "family_ms_per_step": {label: round(value * per_step, 4) for label, value in by_family.items()},
        "top_kernels": [
            {
                "name": name[:160],
                "family": family(name),
                "calls_per_step": round(calls / steps, 2),
                "ms_per_step": round(total * per_step, 4),
            }
            for name, (calls, total) in top
        ],
    }


def _profiled(run, steps: int) -> dict:
    """Runs `run()` `steps` times under the profiler; the kernels from its trace, summarised."""
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profiler:
        started = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - started) * 1e3
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        profiler.export_chrome_trace(trace.name)
        events = json.loads(Path(trace.name).read_text())["traceEvents"]
    kernels = [(e["name"], float(e["ts"]), float(e["dur"])) for e in events if e.get("cat") == "kernel"]
    return summarize(kernels, steps, wall_ms)


def talker_steps(size: str, batch_size: int, steps: int) -> dict:
    from chorus.talker.bench import _voice
    from chorus.talker.engine.engine import EngineConfig, TalkerEngine
    from chorus.talker.loader import build_talker
    from chorus.talker.sampling import SamplingParams

    with tempfile.TemporaryDirectory() as workdir:
        loaded = build_talker(size, "dummy", torch.device("cuda"), torch.bfloat16, Path(workdir))
    frames = 3 * steps + 40
    config = EngineConfig(max_streams=batch_size, max_positions=frames + 128, max_frames=frames,
                          max_buffered_frames=frames, max_prefills_per_step=batch_size, compile_step=True)  # fmt: skip
    engine = TalkerEngine(loaded, config)
    voice = _voice(engine, voice_clone=False)
    for index in range(batch_size):
        engine.submit(f"kernels-{index}", voice, SamplingParams(seed=index), max_frames=frames, ignore_eos=True)
    for _ in range(steps):  # prefills done, every row decoding
        engine.step()
    result = _profiled(engine.step, steps)
    engine.run_until_idle()
    if engine.runner.graphs is not None:
        engine.runner.graphs.release()
    return {"engine": "talker", "size": size, "batch_size": batch_size} | result


def vocoder_chunks(num_streams: int, chunk_frames: int, steps: int) -> dict:
    from chorus.vocoder.engine.runner import CodecRunner
    from chorus.vocoder.loader import load_codec

    torch.backends.cudnn.benchmark = True
    decoder = load_codec("released", load_format="dummy", device=torch.device("cuda"), dtype=torch.bfloat16).decoder
    runner = CodecRunner(decoder, max_streams=num_streams, graph_batch_sizes=(num_streams,),
                         graph_chunk_frames=(chunk_frames,))  # fmt: skip
    slots = list(range(num_streams))
    codes = torch.randint(0, 2048, (num_streams, chunk_frames, 16))
    runner.decode(slots, codes, new_streams=slots)
    result = _profiled(lambda: runner.decode(slots, codes), steps)
    runner.close()
    audio_s = num_streams * chunk_frames * decoder.samples_per_frame / 24000
    return {"engine": "vocoder", "streams": num_streams, "chunk_frames": chunk_frames,
            "gpu_ms_per_audio_s": round(result["gpu_busy_ms_per_step"] / audio_s, 3)} | result  # fmt: skip


def diffusion_forwards(row_counts: list[int], steps: int) -> list[dict]:
    from chorus.diffusion.dit import StableAudioDenoiser
    from chorus.diffusion.graphs import GraphedDenoiser
    from chorus.diffusion.loader import load_models

    models = load_models("dummy", load_format="dummy", device="cuda", dtype="float16", seed=0)
    denoiser = StableAudioDenoiser(
        models.transformer, models.time_frequencies, compile_blocks=True, attention_backend="cudnn"
    )
    graphed = GraphedDenoiser.captured(denoiser, models, max(row_counts))
    config = models.transformer.config
    results = []
    for rows in row_counts:
        inputs = (
            torch.randn(rows, models.num_latent_channels, models.num_latent_frames, device="cuda"),
            torch.rand(rows, device="cuda"),
            torch.randn(rows, graphed.num_cross_tokens, config.cross_attention_input_dim, device="cuda"),
            torch.randn(rows, 1, config.global_states_input_dim, device="cuda"),
        )
        with torch.inference_mode():
            graphed(*inputs)
            result = _profiled(lambda: graphed(*inputs), steps)  # noqa: B023 (called before the next rows)
        results.append({"engine": "diffusion", "rows": rows, "latent_frames": models.num_latent_frames} | result)
    graphed.release()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chorus.bench.kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="0.6b", help="talker shapes: 0.6b or 1.7b")
    parser.add_argument("--talker-batches", default="1,64", type=lambda text: [int(v) for v in text.split(",") if v])
    parser.add_argument("--vocoder-streams", default="16,64", type=lambda text: [int(v) for v in text.split(",") if v])
    parser.add_argument(
        "--diffusion-rows",
        default="",
        type=lambda text: [int(v) for v in text.split(",") if v],
        help="DiT forwards at these batch rows (2: one request with CFG), e.g. 2,16",
    )
    parser.add_argument("--chunk-frames", type=int, default=25)
    parser.add_argument("--steps", type=int, default=20, help="profiled steps (chunks) per configuration")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (it profiles the engines' CUDA graphs)")
    rows = []
    for batch_size in args.talker_batches:
        rows.append(talker_steps(args.size, batch_size, args.steps))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "top_kernels"}), file=sys.stderr, flush=True)
    for num_streams in args.vocoder_streams:
        rows.append(vocoder_chunks(num_streams, args.chunk_frames, args.steps))
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "top_kernels"}), file=sys.stderr, flush=True)
    if args.diffusion_rows:
        for result in diffusion_forwards(args.diffusion_rows, args.steps):
            rows.append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "top_kernels"}), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"kernels-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {"benchmark": "kernels", "commit": commit(), "host": platform.node(),
              "device": torch.cuda.get_device_name(), "families": [label for label, _ in FAMILIES] + ["other"],
              "results": rows}  # fmt: skip
    path.write_text(json.dumps(report, indent=2))
    write_stacked_bars(path.with_suffix(".png"), [list(row["family_ms_per_step"].values()) for row in rows])
    print(f"wrote {path} and .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

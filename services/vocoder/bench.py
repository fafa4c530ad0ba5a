"""Vocoder benchmark: `python -m chorus.vocoder.bench` (released decoder shapes, dummy weights).

Measures first-chunk latency (a new stream's 1-frame chunk) and steady-state audio seconds per second at
several concurrent stream counts with 25-frame chunks, next to a one-shot decode of the same frames in the
reference's way (300-frame windows with 25 frames of left context). The official qwen-tts package cannot
be imported beside transformers 5, so that one-shot runs our module, which matches it within 1e-4; with
`--reference-python .venv-ref/bin/python` the official package's own one-shot decode is timed as well (fp32,
in a subprocess, `bench_reference.py`).
Precisions fp32 (strict), tf32 and bf16 run in turn. Writes JSON and a PNG (bar pairs: streamed vs one-shot
audio-s/s, per precision and stream count) to `bench/results/vocoder-*`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from chorus.bench.report import commit
from chorus.bench_png import write_grouped_bars
from chorus.vocoder.engine.build import CUDNN_ALGORITHMS_TRIED
from chorus.vocoder.engine.engine import DecodeEngine, EngineSettings
from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.loader import RELEASED_CONFIG, load_codec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _first_chunk_ms(runner: CodecRunner, repeats: int) -> float:
    codes = torch.randint(0, 2048, (1, 1, 16))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.decode([0], codes, new_streams=[0])
        _sync(runner.device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _engine_first_chunk_ms(runner: CodecRunner, repeats: int) -> float:
    """Through the asyncio engine (default settings: a lone stream skips the batching window): open, send 1 frame,
    first audio. Stops the engine, which releases the runner's graphs: call last."""

    async def measure() -> list[float]:
        engine = DecodeEngine(runner, EngineSettings())
        await engine.start()
        codes = np.random.default_rng(0).integers(0, 2048, (1, 16))
        times = []
        for index in range(repeats):
            start = time.perf_counter()
            async with engine.open_stream(f"bench-{index}") as stream:
                await stream.send(codes)
                await anext(stream)
                times.append((time.perf_counter() - start) * 1e3)
        await engine.stop()
        return times

    return statistics.median(asyncio.run(measure()))


def _streamed_audio_s_per_s(runner: CodecRunner, num_streams: int, chunk_frames: int, num_chunks: int) -> float:
    slots = list(range(num_streams))
    codes = torch.randint(0, 2048, (num_streams, chunk_frames, 16))
    runner.decode(slots, codes, new_streams=slots)  # warm-up
    _sync(runner.device)
    start = time.perf_counter()
    for _ in range(num_chunks):
        runner.decode(slots, codes)
    _sync(runner.device)
    audio_s = num_streams * num_chunks * chunk_frames * runner.decoder.samples_per_frame / 24000
    return audio_s / (time.perf_counter() - start)


# Whole 24 kHz utterances at 96 channels take ~150 MB per stream per activation: one-shot decodes go in groups.
_ONE_SHOT_MAX_BATCH = 16


@torch.inference_mode()
def _one_shot_audio_s_per_s(decoder, num_streams: int, num_frames: int) -> float:
    """The reference's decode: 300-frame windows, each re-decoded with 25 frames of left context."""
    device = decoder.pre_conv.conv.weight.device
    codes = torch.randint(0, 2048, (num_streams, num_frames, 16), device=device)

    def run() -> None:
        for first in range(0, num_streams, _ONE_SHOT_MAX_BATCH):
            rows = codes[first : first + _ONE_SHOT_MAX_BATCH]
            for start in range(0, num_frames, 300):
                context = min(25, start)
                waveform, _ = decoder(rows[:, start - context : start + 300], decoder.new_state(rows.shape[0]))
                waveform[:, context * decoder.samples_per_frame :].cpu()

    run()
    _sync(device)
    began = time.perf_counter()
    run()
    _sync(device)
    return num_streams * num_frames * decoder.samples_per_frame / 24000 / (time.perf_counter() - began)


_PRECISIONS = {  # name: (decoder dtype, TF32 allowed in matmuls and convs)
    "fp32": (torch.float32, False),
    "tf32": (torch.float32, True),
    "bf16": (torch.bfloat16, False),
}


def _measure(args: argparse.Namespace, device: torch.device, precision: str) -> dict:
    dtype, allow_tf32 = _PRECISIONS[precision]
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32
    torch.backends.cudnn.benchmark = True  # static shapes per graph bucket: autotune each conv once
    torch.backends.cudnn.benchmark_limit = CUDNN_ALGORITHMS_TRIED  # as the engine does
    load_format = "dummy" if args.model == "released" else "auto"
    decoder = load_codec(args.model, load_format=load_format, device=device, dtype=dtype).decoder
    is_graphed = device.type == "cuda" and not args.no_graphs
    runner = CodecRunner(
        decoder,
        max_streams=max(args.streams),
        graph_batch_sizes=tuple(sorted({1, *args.streams})) if is_graphed else (),
        graph_chunk_frames=(1, args.chunk_frames) if is_graphed else (),
    )
    eager = CodecRunner(decoder, max_streams=1)
    result = {
        "first_chunk_ms": _first_chunk_ms(runner, repeats=20),
        "first_chunk_eager_ms": _first_chunk_ms(eager, repeats=20),
        "cuda_graphs": is_graphed,
        "captured_shapes": runner.captured_shapes,
        "streams": {},
    }
    num_frames = args.num_chunks * args.chunk_frames
    for num_streams in args.streams:
        streamed = _streamed_audio_s_per_s(runner, num_streams, args.chunk_frames, args.num_chunks)
        one_shot = _one_shot_audio_s_per_s(decoder, num_streams, num_frames)
        result["streams"][num_streams] = {
            "streamed_audio_s_per_s": streamed,
            "one_shot_audio_s_per_s": one_shot,
            "streamed_over_one_shot": streamed / one_shot,
        }
        print(
            f"{precision} {num_streams:4d} streams: streamed {streamed:9.1f} audio-s/s, "
            f"one-shot {one_shot:9.1f} audio-s/s"
        )
    result["first_chunk_engine_ms"] = _engine_first_chunk_ms(runner, repeats=20)
    print(
        f"{precision} first chunk (1 frame, new stream): {result['first_chunk_ms']:.2f} ms runner, "
        f"{result['first_chunk_eager_ms']:.2f} ms eager runner, {result['first_chunk_engine_ms']:.2f} ms via engine"
    )
    del runner, eager, decoder
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def _official_one_shot(args: argparse.Namespace, decoder_config: dict) -> dict:
    """Times the official package's decode in its own environment, one subprocess per stream count."""
    script = Path(__file__).with_name("bench_reference.py")
    num_frames = args.num_chunks * args.chunk_frames
    results = {}
    for num_streams in args.streams:
        command = [args.reference_python, str(script), args.device, json.dumps(decoder_config)]
        done = subprocess.run([*command, str(num_streams), str(num_frames)], capture_output=True, text=True)
        if done.returncode:
            results[num_streams] = {"error": done.stderr.strip().splitlines()[-1:]}
            continue
        results[num_streams] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"official {num_streams:4d} streams: one-shot {results[num_streams]['audio_s_per_s']:9.1f} audio-s/s")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precisions", nargs="+", default=list(_PRECISIONS), choices=list(_PRECISIONS))
    parser.add_argument("--model", default="released", help="released (dummy weights), tiny, or a folder")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--chunk-frames", type=int, default=25)
    parser.add_argument("--num-chunks", type=int, default=8)
    parser.add_argument("--no-graphs", action="store_true", help="eager only")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--reference-python", help="a Python with qwen-tts 0.1.1 (e.g. .venv-ref/bin/python)")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "settings": vars(args),
        "one_shot": "the reference's 300/25 windowed decode run on our module (qwen-tts cannot import beside "
        "transformers 5); our module matches the reference within 1e-4",
        "precisions": {precision: _measure(args, device, precision) for precision in args.precisions},
    }
    if args.reference_python:
        if args.model == "released":
            decoder_config = RELEASED_CONFIG.decoder.to_official()
        else:
            decoder_config = load_codec(args.model).config.decoder.to_official()
        results["official_one_shot_fp32"] = _official_one_shot(args, decoder_config)
    results["commit"] = commit()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"vocoder-{stamp}.json").write_text(json.dumps(results, indent=2))
    pairs = [
        (row["streamed_audio_s_per_s"], row["one_shot_audio_s_per_s"])
        for result in results["precisions"].values()
        for row in result["streams"].values()
    ]
    write_grouped_bars(out / f"vocoder-{stamp}.png", pairs)
    print(f"wrote {out / f'vocoder-{stamp}.json'} and .png")
    return results


if __name__ == "__main__":
    main()

"""`python bench/cudnn_limit_probe.py DTYPE LIMIT [STREAMSxFRAMES ...]` on a GPU, one process per setting (cuDNN
keeps what it tuned for the process's life): the vocoder's graph capture time and decode time at (streams, frames)
shapes of the released decoder (by default five of the graph buckets the engine captures), dummy weights, with cuDNN
autotuning its convolutions over the first LIMIT algorithms it ranks (`off`: no autotuning, its first pick). DTYPE is
bfloat16 or float32 (strict, no TF32, as the engine runs it). Why the engine sets `torch.backends.cudnn.benchmark_limit`
to 3. One JSON line a shape on stdout."""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.loader import load_codec

SHAPES = ("64x25", "48x25", "24x16", "12x4", "3x1")


def probe(codec, streams: int, frames: int) -> tuple[float, float]:
    """(seconds to capture the graph, median milliseconds a decode of the shape takes through it)."""
    started = time.perf_counter()
    runner = CodecRunner(codec.decoder, streams, graph_batch_sizes=(streams,), graph_chunk_frames=(frames,))
    torch.cuda.synchronize()
    capture_s = time.perf_counter() - started
    codes, slots, times = torch.randint(0, 2048, (streams, frames, 16)), list(range(streams)), []
    for _ in range(30):
        started = time.perf_counter()
        runner.decode(slots, codes)  # returns the waveform on the host: the decode has finished
        times.append((time.perf_counter() - started) * 1e3)
    runner.close()
    return capture_s, statistics.median(times[5:])


def main() -> None:
    dtype, limit = sys.argv[1], sys.argv[2]
    torch.backends.cudnn.benchmark = limit != "off"
    if limit != "off":
        torch.backends.cudnn.benchmark_limit = int(limit)
    torch.backends.cudnn.allow_tf32 = False
    codec = load_codec("released", load_format="dummy", device=torch.device("cuda"), dtype=getattr(torch, dtype))
    for shape in sys.argv[3:] or SHAPES:
        streams, frames = map(int, shape.split("x"))
        capture_s, decode_ms = probe(codec, streams, frames)
        row = {"dtype": dtype, "limit": limit, "streams": streams, "frames": frames}
        print(json.dumps(row | {"capture_s": round(capture_s, 2), "decode_ms": round(decode_ms, 3)}), flush=True)


if __name__ == "__main__":
    main()

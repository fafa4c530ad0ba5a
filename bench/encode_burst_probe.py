"""`python bench/encode_burst_probe.py [--format mp3] [--streams 16] [--pieces 2] [--threads 2]`: when a wave of
streams ends together, does taking the oldest stream's encode first finish them sooner than first-in-first-out?

An experiment kept for its answer. A gateway process encodes each stream one piece at a time: it submits a stream's
next piece once the last is encoded and journaled. When closed-loop clients' streams end together, each with its
last seconds of audio still to encode, a first-in-first-out pool serves them round-robin and every stream finishes
at the end of the burst. This encodes `--streams` streams of `--pieces` 2 s pieces of speech-like audio at once on
`EncoderThreads`, the gateway's encoders and pool, first with each piece ordered by its submission (`submit`, first
in first out), then by its stream's start (`submit_ordered` with `stream_order`, as `SpeechRun` orders a stream over
a second ahead of its listener), with a 0.5 ms pause for the journal between pieces, and prints each way's mean,
median and last completion in ms, `--rounds` times, alternating. One JSON line a way and round.

Answer (the 2-core CPU box, idle, three rounds): yes, on average. 16 streams × two pieces of mp3 on 2 threads: mean
83–91 ms oldest first against 145–162 first in first out, the last stream 142–150 against 148–163; opus 54–61 against
81–94 ms, the last 93–103 against 84–97.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np

from chorus.bench.encoders import SPEECH_RATE_HZ, speech_like
from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.audio.encoder_threads import EncoderThreads, stream_order

PIECE_S = 2.0
JOURNAL_S = 0.0005


async def encode_stream(threads: EncoderThreads, format_name: str, pieces: list, started_s: float, oldest_first: bool):
    """Seconds from the burst's start until the stream's last bytes; a stream started at `started_s` (its age)."""
    encoder, burst_started = StreamingEncoder(format_name, SPEECH_RATE_HZ, threads=threads), time.perf_counter()
    # Seconds of audio ahead of its listener: the order a stream ending its audio gets (not urgent), by its start.
    order = stream_order(started_s, started_s, len(pieces) * PIECE_S, started_s) if oldest_first else None
    for piece in pieces:
        await encoder.encode_async(piece, order)
        await asyncio.sleep(JOURNAL_S)
    await encoder.flush_async(order)
    return time.perf_counter() - burst_started


async def burst(format_name: str, num_streams: int, num_pieces: int, num_threads: int, oldest_first: bool) -> dict:
    pieces = np.array_split(speech_like(PIECE_S * num_pieces), num_pieces)
    threads = EncoderThreads(num_threads)
    try:
        await encode_stream(threads, format_name, pieces, 0.0, oldest_first)  # the codec's first open
        now_s = time.monotonic()
        done = await asyncio.gather(
            *(encode_stream(threads, format_name, pieces, now_s - 10 + i, oldest_first) for i in range(num_streams))
        )
    finally:
        threads.shutdown()
    return {
        "order": "oldest first" if oldest_first else "first in first out",
        "format": format_name,
        "streams": num_streams,
        "pieces": num_pieces,
        "threads": num_threads,
        "mean_ms": round(statistics.mean(done) * 1000, 1),
        "median_ms": round(statistics.median(done) * 1000, 1),
        "last_ms": round(max(done) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="mp3")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--pieces", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for oldest_first in (False, True):
            row = asyncio.run(burst(args.format, args.streams, args.pieces, args.threads, oldest_first))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

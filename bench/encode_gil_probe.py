"""`python bench/encode_gil_probe.py [--formats mp3,opus] [--seconds 4] [--piece-ms 80]`: how often does a gateway
encode need the GIL?

An experiment kept for its answer. PyAV releases the GIL while a codec runs, yet more encoder threads in one gateway
process made each encode slower (README, Gateway workers). This encodes speech-like audio with the gateway's
`StreamingEncoder`, piece by piece, on one thread while another thread runs pure Python for `--seconds`. The Python
thread gives the GIL up only when the interpreter's switch interval (5 ms) forces it, so the encoder advances one
GIL turn at a time, and `--seconds` / switch interval / the audio encoded is how many times an audio second's encode
takes the GIL back. It prints one JSON line a format: the audio encoded, the turns per audio second, and the CPU an
audio second of the same encode costs alone.

Answer (the 2-core CPU box, idle; 80 ms and 2 s pieces): mp3 75–86 turns an audio second, opus 93–120 (a codec
frame's send and receive, each packet's mux and its write to the sink), against 3.3 and 1.9 ms of CPU. Each turn is
a wait behind whatever else in the process holds the GIL: the other encoder threads and the event loop. Hence a
gateway process per core, one encoder thread each, on a GPU host. Run it on an idle machine: with other processes
taking the cores (a test run beside it) the figures fell to 2–12 turns, the OS's scheduling standing in for the
switch interval.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

from chorus.bench.encoders import SPEECH_RATE_HZ, speech_like
from chorus.gateway.audio import StreamingEncoder

STREAM_S = 10.0


def encode_alone_cpu_ms_per_audio_s(format_name: str, pieces: list[np.ndarray]) -> float:
    started = time.thread_time()
    encoder = StreamingEncoder(format_name, SPEECH_RATE_HZ)
    for piece in pieces:
        encoder.encode(piece)
    encoder.flush()
    return (time.thread_time() - started) * 1000 / STREAM_S


def audio_encoded_beside_python(format_name: str, pieces: list[np.ndarray], seconds: float, piece_s: float) -> float:
    """Seconds of audio encoded while this thread runs Python for `seconds`."""
    done, stop = [0], threading.Event()

    def encode_streams() -> None:
        while not stop.is_set():
            encoder = StreamingEncoder(format_name, SPEECH_RATE_HZ)
            for piece in pieces:
                if stop.is_set():
                    encoder.close()
                    return
                encoder.encode(piece)
                done[0] += 1
            encoder.flush()

    thread = threading.Thread(target=encode_streams)
    thread.start()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:  # pure Python: holds the GIL until the switch interval takes it
        pass
    stop.set()
    thread.join()
    return done[0] * piece_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="mp3,opus")
    parser.add_argument("--seconds", type=float, default=4.0, help="how long the Python thread runs, per format")
    parser.add_argument("--piece-ms", type=int, default=80, help="audio per encode call (a stream's first pieces)")
    args = parser.parse_args(argv)
    audio = speech_like(STREAM_S)
    piece_s = args.piece_ms / 1000
    pieces = np.array_split(audio, round(STREAM_S / piece_s))
    for format_name in args.formats.split(","):
        alone = encode_alone_cpu_ms_per_audio_s(format_name, pieces)
        audio_s = audio_encoded_beside_python(format_name, pieces, args.seconds, piece_s)
        turns = args.seconds / sys.getswitchinterval() / max(audio_s, piece_s)
        print(
            json.dumps(
                {
                    "format": format_name,
                    "piece_ms": args.piece_ms,
                    "audio_s_beside_python": round(audio_s, 2),
                    "gil_turns_per_audio_s": round(turns),
                    "cpu_ms_per_audio_s_alone": round(alone, 2),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The threads that encode audio in a gateway process.

PyAV releases the GIL while a codec runs, so streams' encoding spreads over cores; but between codec calls (each
codec frame's send and receive, each packet's mux and write) an encode takes the GIL back, ~100 times per second of
audio, and threads of one process queue for it behind each other and the event loop. On a 16-core H100 host, one
process encoding mp3 on 4 threads made 572 audio seconds a second, on 16 threads 303 (each encode's CPU time grew
from 4.1 to 9.0 ms per audio second). So each gateway process gets its share of the host's cores, not the event
loop's default pool (cores + 4), and a GPU host runs a process per core, one encoder thread each: 64 mp3 streams on
a 16-core H200 host made 645 audio-s/s through 16 processes of one thread, 621 through 8 of 2, 570 through 4 of 4
(pcm 635), each request's last pieces encoded 70–80 ms after the talker's end instead of 145–220.

The threads flush denormal floats to zero. libopus's float filters decay into denormals on silence (leading and
trailing silence, pauses), where each operation costs ~100 cycles: 10 s of silence took 11.5 ms of CPU per audio
second to encode against 1.1 ms with flushing (2-core CPU box; 20.9 ms unflushed on the H100 host, against
5.7 ms for speech). A flushed value is below 1.2e-38, far under the 3e-5 step of 16-bit audio.

The threads take the most pressing encode first (`EncoderThreads.submit_ordered`), not the first submitted. A
stream encodes one piece at a time and submits its next once the last is journaled, so in a first-in-first-out pool
streams share the threads round-robin: when streams end together (closed-loop clients), each with its last seconds
of audio to encode, all of them finish at the end of the burst. Taken oldest stream first, they finish one after
another, on average sooner (`python bench/encode_burst_probe.py`). A stream whose listener has less than a second
of its audio left goes first of all (`stream_order`).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import functools
import heapq
import itertools
import os
import platform
import sys
import threading
import time

# Where glibc's fenv_t keeps the control register that flushes denormals, and its bits.
_FLUSH_BITS = {
    "x86_64": (28, 0x8040),  # MXCSR at byte 28: flush-to-zero (bit 15) and denormals-are-zero (bit 6)
    "aarch64": (0, 1 << 24),  # FPCR first: FZ (bit 24)
}
_FENV_BYTES = 64  # more than fenv_t on either (32 and 8 bytes)
# A stream whose listener has less than this much of its audio ahead is urgent: its encodes go first, least lead
# first (a newcomer's first pieces, a stream caught up by its listener).
URGENT_LEAD_S = 1.0
# A process's encoder threads by default at most: one process encoding mp3 made 572 audio-s/s on 4 threads, 303 on 16
# (a 16-core H100 host); a pod sees its node's cores, however few it may use.
MAX_DEFAULT_ENCODER_THREADS = 4


def default_encoder_threads(num_processes: int) -> int:
    """Threads per gateway process when `num_processes` share this host: its cores divided among them, at least 1,
    at most `MAX_DEFAULT_ENCODER_THREADS`."""
    share = len(os.sched_getaffinity(0)) // max(1, num_processes)
    return max(1, min(MAX_DEFAULT_ENCODER_THREADS, share))


def stream_order(started_s: float, first_audio_s: float | None, audio_s: float, now_s: float) -> tuple:
    """The place of a stream's next encode in `EncoderThreads` (`time.monotonic` seconds): by its listener's lead
    while under `URGENT_LEAD_S` (before its first audio, none), else by when the stream started, oldest first.
    `audio_s`: the stream's audio encoded so far."""
    lead_s = 0.0 if first_audio_s is None else audio_s - (now_s - first_audio_s)
    return (0, lead_s) if lead_s < URGENT_LEAD_S else (1, started_s)


class EncoderThreads(concurrent.futures.Executor):
    """The pool for `StreamingEncoder` and whole-file encodes: threads that flush denormals to zero and run the
    submitted call with the smallest order first (a tuple; equal orders in submission order). Plain `submit`
    (whole-file encodes) orders a call by its submission time, as `stream_order` orders a stream by its start."""

    def __init__(self, num_threads: int) -> None:
        if num_threads < 1:
            raise ValueError(f"encoder threads: must be at least 1, got {num_threads}")
        self._queue: list[tuple] = []  # heap of (order, submission number, future, fn, args, kwargs)
        self._submitted = itertools.count()
        self._changed = threading.Condition()
        self._is_shut_down = False
        # Daemon threads, as the asyncio loop's default pool's are not: one never outlives its process's exit,
        # mid-encode or waiting for work.
        self._threads = [
            threading.Thread(target=self._work, name=f"encoder_{index}", daemon=True) for index in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        return self.submit_ordered((1, time.monotonic()), fn, *args, **kwargs)

    def submit_ordered(self, order: tuple, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        with self._changed:
            if self._is_shut_down:
                raise RuntimeError("encoder threads: submitted after shutdown")
            heapq.heappush(self._queue, (order, next(self._submitted), future, fn, args, kwargs))
            self._changed.notify()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Calls already submitted still run, unless `cancel_futures`."""
        with self._changed:
            self._is_shut_down = True
            if cancel_futures:
                for _, _, future, *_ in self._queue:
                    future.cancel()
                self._queue.clear()
            self._changed.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _work(self) -> None:
        flush_denormals_to_zero()
        while True:
            with self._changed:
                while not self._queue and not self._is_shut_down:
                    self._changed.wait()
                if not self._queue:
                    return
                _, _, future, fn, args, kwargs = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:
                future.set_exception(error)


def flush_denormals_to_zero() -> bool:
    """Makes the calling thread's float arithmetic flush denormals to zero; False where this platform is not
    supported (only the speed of silent audio depends on it)."""
    control = _control_register()
    if control is None:
        return False
    env, offset, value, bits = control
    env[offset : offset + 4] = (value | bits).to_bytes(4, "little")
    return _libm().fesetenv(env) == 0


def flushes_denormals() -> bool:
    """Whether the calling thread's float arithmetic flushes denormals to zero."""
    control = _control_register()
    if control is None:
        return False
    _, _, value, bits = control
    return value & bits == bits


def _control_register() -> tuple[ctypes.Array, int, int, int] | None:
    """The calling thread's floating-point environment, the offset of its control register in it, that register's
    value and its flush bits; None where this platform is not supported."""
    if sys.platform != "linux" or platform.machine() not in _FLUSH_BITS:
        return None
    env = ctypes.create_string_buffer(_FENV_BYTES)
    if _libm().fegetenv(env) != 0:
        return None
    offset, bits = _FLUSH_BITS[platform.machine()]
    return env, offset, int.from_bytes(env.raw[offset : offset + 4], "little"), bits


@functools.cache
def _libm() -> ctypes.CDLL:
    """Loaded once: `find_library` runs `ldconfig` in a subprocess."""
    return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")

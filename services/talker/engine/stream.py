"""Per-request output of the talker engine: a bounded frame buffer read from asyncio or a plain thread.

The engine thread pushes frames; the consumer takes them. The bound is enforced by the scheduler (a request
whose buffer is full is not advanced), so a slow consumer pauses only its own request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from chorus.talker.engine.request import FinishReason


class FrameStream:
    def __init__(
        self, request_id: str, capacity_frames: int, on_consumed: Callable[[int], None], first_frame_index: int = 0
    ) -> None:
        self.request_id = request_id
        self.capacity_frames = capacity_frames
        self.first_frame_index = first_frame_index  # the request's index of this stream's first frame (resumed: N)
        self.finish_reason: FinishReason | None = None
        self.error: str | None = None
        # Usage and timings (time.perf_counter seconds) for the final message; written by the engine thread.
        self.num_frames = 0  # frames this stream produced
        self.num_text_tokens = 0
        self.admitted_at = time.perf_counter()
        self.admitted_at_unix_s = time.time()  # the same moment on the wall clock, for other processes' timelines
        self.scheduled_at: float | None = None
        self.scheduled_step: int | None = None  # the engine step that prefilled it
        self.steps_to_first_frame: int | None = None  # engine steps from that one to its first frame's (2 at best)
        self.first_frame_at: float | None = None
        self.finished_at: float | None = None
        self._on_consumed = on_consumed
        self._frames: deque[np.ndarray] = deque()
        self._cond = threading.Condition()
        # asyncio readers: their event → (their loop, the frames they wait for)
        self._waiters: dict[asyncio.Event, tuple[asyncio.AbstractEventLoop, int]] = {}

    # engine thread side

    def push(self, frame: np.ndarray) -> None:
        with self._cond:
            self._frames.append(frame)
            self.num_frames += 1
            if self.first_frame_at is None:
                self.first_frame_at = time.perf_counter()
            num_ready = len(self._frames)
        self._notify(num_ready)

    def finish(self, reason: FinishReason, error: str | None = None) -> None:
        with self._cond:
            if self.finish_reason is None:
                self.finish_reason, self.error = reason, error
                self.finished_at = time.perf_counter()
        self._notify(None)

    def _notify(self, num_ready: int | None) -> None:
        """Wake the blocking readers, and each asyncio reader whose chunk is now complete (`num_ready` frames
        buffered; None: the stream ended). An event-loop wake-up costs tens of microseconds of the loop's thread:
        one per chunk, not one per frame."""
        with self._cond:
            self._cond.notify_all()
            due = [
                (loop, event)
                for event, (loop, min_frames) in self._waiters.items()
                if num_ready is None or num_ready >= min_frames
            ]
        for loop, event in due:
            loop.call_soon_threadsafe(event.set)

    # consumer side

    @property
    def finished(self) -> bool:
        """True once the stream ended and every frame was taken."""
        with self._cond:
            return self.finish_reason is not None and not self._frames

    def _take(self, min_frames: int, max_frames: int) -> np.ndarray | None:
        """Frames `[k, 16]` int16 if ≥ `min_frames` are ready (or the stream ended with some); `None` otherwise."""
        with self._cond:
            ready = len(self._frames)
            if ready == 0 or (ready < min_frames and self.finish_reason is None):
                return None
            taken = [self._frames.popleft() for _ in range(min(ready, max_frames))]
        self._on_consumed(len(taken))
        return np.stack(taken)

    def _bounds(self, min_frames: int, max_frames: int | None) -> tuple[int, int]:
        # Waiting for more frames than the buffer may hold would stall the request forever.
        min_frames = max(1, min(min_frames, self.capacity_frames))
        return min_frames, max(min_frames, max_frames or self.capacity_frames)

    async def read(self, min_frames: int = 1, max_frames: int | None = None) -> np.ndarray | None:
        """Wait for ≥ `min_frames` frames (fewer at the end) → `[k, 16]` int16; `None` once the stream ended."""
        min_frames, max_frames = self._bounds(min_frames, max_frames)
        event, loop = asyncio.Event(), asyncio.get_running_loop()
        with self._cond:
            self._waiters[event] = (loop, min_frames)
        try:
            while True:
                event.clear()
                frames = self._take(min_frames, max_frames)
                if frames is not None or self.finished:
                    return frames
                await event.wait()
        finally:
            with self._cond:
                del self._waiters[event]

    def read_blocking(self, min_frames: int = 1, max_frames: int | None = None, timeout_s: float | None = None):
        """Thread version of `read`; raises `TimeoutError` after `timeout_s` without output."""
        min_frames, max_frames = self._bounds(min_frames, max_frames)
        while True:
            frames = self._take(min_frames, max_frames)
            if frames is not None or self.finished:
                return frames
            with self._cond:
                ready = len(self._frames) >= min_frames or self.finish_reason is not None
                if not ready and not self._cond.wait(timeout_s):
                    raise TimeoutError(f"no output from request {self.request_id} within {timeout_s} s")

    def collect(self, timeout_s: float | None = None) -> np.ndarray:
        """Every frame until the end `[N, 16]` (tests, benchmarks)."""
        chunks = []
        while (frames := self.read_blocking(1, None, timeout_s)) is not None:
            chunks.append(frames)
        return np.concatenate(chunks) if chunks else np.zeros((0, 16), dtype=np.int16)

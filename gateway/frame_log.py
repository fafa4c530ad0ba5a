"""One speech segment's codec frames as the talker makes them, kept whole for exact fail-over.

The talker side appends chunks; the vocoder side waits for frames past what it sent. Because every
frame stays here (4 KiB per 10 s of audio), a replacement talker is sent all of them and continues
after them, and a replacement vocoder is primed with those whose audio was already delivered, so a
replica dying mid-stream changes nothing in the output. A run taken over by another gateway
process starts from the frames its journal holds (`initial`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from chorus.v1 import common_pb2

NUM_CODEBOOKS = 16  # the Qwen3-TTS 12 Hz codec
FRAME_BYTES = 2 * NUM_CODEBOOKS  # int16 codes, frame-major
TIMED_FRAMES = 32  # when each of a segment's first frames came is kept: its first pieces' (1 + 2 + 4 + 8 + 16 frames)


class FrameSink(Protocol):
    """Where a log's frames are journaled as they come (the run's frame journal in Redis)."""

    async def frames(self, offset: int, codes: bytes) -> None: ...

    async def finished(self, num_frames: int) -> None: ...


class FrameLog:
    def __init__(
        self, initial: bytes = b"", is_finished: bool = False, sink: FrameSink | None = None, is_taken_over=False
    ) -> None:
        self._codes = bytearray(initial)
        self.is_finished = is_finished  # the talker said its Final: no more frames
        self.is_taken_over = is_taken_over  # the segment's run began in another gateway process
        self.error: BaseException | None = None
        self.sink = sink
        # When this process got each frame past `initial`, the first TIMED_FRAMES of them (time.time()).
        self.frame_times: list[float] = []
        self.last_frames_at: float | None = None  # when the latest frames came here (time.time())
        self.finished_at: float | None = None  # when the talker's Final came
        self.talker_timings: common_pb2.Timings | None = None  # its Final's
        self.talker_called_at: float | None = None  # this process opened the first talker call (time.time())
        self._changed = asyncio.Event()

    @property
    def num_frames(self) -> int:
        return len(self._codes) // FRAME_BYTES

    async def append(self, chunk: common_pb2.CodecChunk) -> None:
        offset = self.num_frames
        self._codes += chunk.codes
        self.last_frames_at = time.time()
        if len(self.frame_times) < TIMED_FRAMES:
            new_frames = min(self.num_frames - offset, TIMED_FRAMES - len(self.frame_times))
            self.frame_times += [self.last_frames_at] * new_frames
        self._changed.set()
        if self.sink is not None:
            await self.sink.frames(offset, chunk.codes)

    async def finish(self, talker_timings: common_pb2.Timings | None = None) -> None:
        self.is_finished = True
        self.finished_at = time.time()
        self.talker_timings = talker_timings
        self._changed.set()
        if self.sink is not None:
            await self.sink.finished(self.num_frames)

    def fail(self, error: BaseException) -> None:
        """The talker side gave up: waiters raise `error`."""
        self.error = error
        self._changed.set()

    def chunk(self, start: int, stop: int | None = None, sequence: int = 0, first: int = 0) -> common_pb2.CodecChunk:
        """Frames `[start, stop)` as one CodecChunk of a stream that began at frame `first`."""
        stop = self.num_frames if stop is None else stop
        return common_pb2.CodecChunk(
            codes=bytes(self._codes[start * FRAME_BYTES : stop * FRAME_BYTES]),
            num_frames=stop - start,
            num_codebooks=NUM_CODEBOOKS,
            sequence=sequence,
            frame_offset=start - first,
        )

    async def wait_beyond(self, num_frames: int) -> int:
        """Waits until more than `num_frames` frames are here or the talker finished; returns the count.
        Raises the talker side's error."""
        while True:
            if self.error is not None:
                raise self.error
            if self.num_frames > num_frames or self.is_finished:
                return self.num_frames
            self._changed.clear()
            await self._changed.wait()

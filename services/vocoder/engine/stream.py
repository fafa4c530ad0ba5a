"""One decode stream as the engine sees it: queued input frames, bounded output, lifecycle."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import time

import numpy as np


class StreamStatus(enum.Enum):
    OPEN = "open"
    FINISHED = "finished"  # input ended and every frame decoded
    CANCELLED = "cancelled"  # closed by its owner before the end
    ABANDONED = "abandoned"  # nobody sent or read for longer than the idle timeout
    FAILED = "failed"


@dataclasses.dataclass(frozen=True, slots=True)
class PcmPiece:
    """Decoded audio of consecutive frames of one stream."""

    waveform: np.ndarray  # (num_frames · samples_per_frame,) float32 in [-1, 1]
    sample_offset: int  # index of the first sample in the stream's output (context frames excluded)
    num_frames: int


@dataclasses.dataclass(slots=True)
class PendingFrames:
    """Frames received but not decoded yet."""

    codes: np.ndarray  # (num_frames, num_quantizers) int64
    is_context: bool  # context frames prime the state; their audio is dropped


class StreamRecord:
    """Engine-side bookkeeping of one stream; touched only on the event loop."""

    def __init__(self, request_id: str, slot: int, max_pending_outputs: int) -> None:
        self.request_id = request_id
        self.slot = slot
        self.status = StreamStatus.OPEN
        self.error: BaseException | None = None
        self.segments: collections.deque[PendingFrames] = collections.deque()
        self.is_input_done = False
        self.input_done_s = 0.0  # when its input ended (time.monotonic)
        self.is_decoded_since_end = False  # a decode for it started after its input ended
        self.is_started = False  # False until its state row has been reset by a first decode
        self.num_pending_frames = 0
        self.num_frames_decoded = 0  # output frames only
        self.first_output_s: float | None = None  # when its first audio was decoded (time.monotonic)
        self.outputs: collections.deque[PcmPiece] = collections.deque()
        self.max_pending_outputs = max_pending_outputs
        self.output_ready = asyncio.Event()  # set on new output and on the end of the stream
        self.is_in_flight = False
        self.last_activity_s = time.monotonic()
        self.input_room = asyncio.Event()
        self.input_room.set()

    def touch(self) -> None:
        self.last_activity_s = time.monotonic()

    def push(self, codes: np.ndarray, is_context: bool) -> None:
        if len(codes):
            self.segments.append(PendingFrames(codes, is_context))
            self.num_pending_frames += len(codes)

    def lead_s(self, now_s: float, frame_s: float) -> float:
        """Audio decoded beyond what a listener playing from the first output on has heard (0 before any)."""
        if self.first_output_s is None:
            return 0.0
        return self.num_frames_decoded * frame_s - (now_s - self.first_output_s)

    def can_schedule(self) -> bool:
        return (
            self.status is StreamStatus.OPEN
            and not self.is_in_flight
            and bool(self.segments)
            and (self.segments[0].is_context or len(self.outputs) < self.max_pending_outputs)
        )

    def take(self, max_frames: int) -> PendingFrames:
        """Removes and returns the next piece of at most `max_frames` frames, never mixing context and output."""
        head = self.segments[0]
        if len(head.codes) <= max_frames:
            self.segments.popleft()
            piece = head
        else:
            piece = PendingFrames(head.codes[:max_frames], head.is_context)
            head.codes = head.codes[max_frames:]
        self.num_pending_frames -= len(piece.codes)
        return piece

    @property
    def is_drained(self) -> bool:
        return self.is_input_done and not self.segments and not self.is_in_flight

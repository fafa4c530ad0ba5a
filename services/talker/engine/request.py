"""Per-request state of the talker engine (host side, no torch)."""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the scheduler imports this module and must stay free of torch
    from chorus.talker.prompt import Prompt, VoiceRequest
    from chorus.talker.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued for a slot, or for enough text to build the prompt
    RUNNING = "running"  # holds a slot
    FINISHED = "finished"


class FinishReason(enum.Enum):
    EOS = "eos"
    MAX_LENGTH = "max_length"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclasses.dataclass(eq=False)
class TalkerRequest:
    request_id: str
    voice: VoiceRequest
    sampling: SamplingParams
    seed: int
    max_frames: int
    max_buffered_frames: int
    ignore_eos: bool = False
    text_started: bool = False  # caller side: whether target text was tokenized yet
    status: Status = Status.WAITING
    slot: int | None = None
    prompt: Prompt | None = None
    num_prompt_positions: int = 0  # before frame 0 (a resumed prompt's prefix-frame positions not included)
    # Frame counts of the whole request: a resumed request starts at its prefix frames, produced elsewhere.
    num_frames: int = 0  # frames generated (handed to the output)
    num_launched: int = 0  # frames whose decode step was launched (≥ num_frames: one step may be in flight)
    buffered_frames: int = 0  # frames handed out but not yet taken by the consumer
    finish_reason: FinishReason | None = None
    error: str | None = None
    arrival: int = 0  # admission order: the newest running request is preempted first
    prompt_blocks: int = 1  # KV blocks its prompt takes (known once its prompt was built)
    # Every frame of the request so far (prefix frames included), 16 int16 codes each: what a preempted request
    # resumes from.
    frame_log: bytearray = dataclasses.field(default_factory=bytearray)

    @property
    def position(self) -> int:
        """Cache position the next decode step writes."""
        return self.num_prompt_positions + self.num_launched

    def can_launch(self, max_positions: int) -> bool:
        """Whether another frame may be launched: under both limits, and the output has room for it."""
        in_flight = self.num_launched - self.num_frames
        return (
            self.num_launched < self.max_frames
            and self.position < max_positions
            and self.buffered_frames + in_flight < self.max_buffered_frames
        )

    def trailing_text_id(self, pad_id: int) -> int | None:
        """Text id for the next decode step; `None` while the text it needs has not arrived yet."""
        return self.prompt.text_id_for(self.num_launched, pad_id)

    @property
    def prompt_ready(self) -> bool:
        """Whether enough text arrived to build the prompt: the streaming layout needs one token, plus one for each
        prefix frame (the trailing text its decode step fed); other layouts need all of it."""
        voice = self.voice
        if voice.text_complete:
            return True
        streams = not voice.non_streaming_text and voice.ref_codes is None
        return streams and len(voice.text_ids) > voice.num_prefix_frames

"""How far a speech run's output may run ahead of what its readers have taken.

A client that reads slowly (or not at all, while detached) must not make its run fill Redis
and hold the backends busy far ahead of it. The run waits in `wait_for_room` before it reads
more from its upstream streams; gRPC flow control then backs up into the talker, whose bounded
per-stream output pauses that one request while the rest of its batch goes on.
"""

from __future__ import annotations

import asyncio
import collections


class OutputLead:
    def __init__(self, max_lead_s: float) -> None:
        if max_lead_s <= 0:
            raise ValueError(f"max_lead_s: must be positive, got {max_lead_s}")
        self.max_lead_s = max_lead_s
        self._end_s: collections.deque[float] = collections.deque()  # audio end of each unread chunk, by sequence
        self._first_unread_sequence = 0
        self._read_s = 0.0  # audio end of the last chunk the furthest reader took
        self._changed = asyncio.Event()

    @property
    def lead_s(self) -> float:
        """Seconds of journaled audio no reader has taken yet."""
        return (self._end_s[-1] - self._read_s) if self._end_s else 0.0

    def journaled(self, sequence: int, audio_end_s: float) -> None:
        """The run journaled chunk `sequence`, whose audio ends `audio_end_s` into the output."""
        assert sequence == self._first_unread_sequence + len(self._end_s), "chunks are journaled in order"
        self._end_s.append(audio_end_s)

    def read(self, sequence: int) -> None:
        """A reader took chunk `sequence` (and so every one before it)."""
        while self._end_s and self._first_unread_sequence <= sequence:
            self._read_s = self._end_s.popleft()
            self._first_unread_sequence += 1
        self._changed.set()

    async def wait_for_room(self) -> None:
        """Returns once the unread audio is under the bound."""
        while self.lead_s >= self.max_lead_s:
            self._changed.clear()
            await self._changed.wait()

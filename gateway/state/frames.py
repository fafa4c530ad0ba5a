"""The codec frames of a speech run, journaled per segment so that another process can continue the run.

Each talker chunk is one stream entry (segment, frame offset, codes); a segment whose talker finished gets an
end entry with its frame count. Entries are placed by frame offset: frames written twice (a process that lost
the run wrote them too, in chunks of other sizes) are read once, only frames contiguous from 0 count, and a
segment counts as finished only with all its frames. The journal expires with the request.
"""

from __future__ import annotations

import dataclasses

import redis.asyncio as redis

from chorus.gateway.state import keys
from chorus.gateway.state.connection import redis_guard


@dataclasses.dataclass
class SegmentFrames:
    codes: bytes = b""  # int16 codes of frames 0..n, frame-major
    is_finished: bool = False  # the talker's Final came: no frames follow


class FrameJournal:
    def __init__(self, client: redis.Redis, ttl_s: int) -> None:
        self.client = client
        self.ttl_s = ttl_s

    async def append(self, request_id: str, segment: int, offset: int, codes: bytes) -> None:
        """Journals frames of `segment` from frame `offset` on."""
        await self._add(request_id, {"segment": segment, "offset": offset, "codes": codes}, set_ttl=offset == 0)

    async def finish(self, request_id: str, segment: int, num_frames: int) -> None:
        """The talker of `segment` finished after `num_frames` frames."""
        await self._add(request_id, {"segment": segment, "end": num_frames}, set_ttl=True)

    async def _add(self, request_id: str, entry: dict, set_ttl: bool) -> None:
        """One entry; the stream's TTL is set with a segment's first frames and its end, not per chunk."""
        key = keys.frames(request_id)
        with redis_guard("journaling codec frames"):
            if not set_ttl:  # the hot path: one command
                await self.client.xadd(key, entry)
                return
            async with self.client.pipeline(transaction=False) as pipe:
                await pipe.xadd(key, entry).expire(key, self.ttl_s).execute()

    async def read(self, request_id: str, num_segments: int, frame_bytes: int) -> list[SegmentFrames]:
        """Every segment's frames, contiguous from frame 0."""
        with redis_guard("reading codec frames"):
            entries = await self.client.xrange(keys.frames(request_id))
        return assemble([fields for _, fields in entries], num_segments, frame_bytes)


def assemble(entries: list[dict[bytes, bytes]], num_segments: int, frame_bytes: int) -> list[SegmentFrames]:
    """The segments' frames from journal entries in the order written. Two processes may both have written a run
    (one had lost it to the other), each in chunks of its own sizes: their frames are the same (the talker is
    seeded), so a chunk that overlaps the frames so far adds its frames past them."""
    segments = [SegmentFrames() for _ in range(num_segments)]
    for fields in entries:
        segment = segments[int(fields[b"segment"])]
        if b"end" in fields:  # its writer wrote every frame before it: they are read by now
            segment.is_finished = int(fields[b"end"]) == len(segment.codes) // frame_bytes
            continue
        start = int(fields[b"offset"]) * frame_bytes
        if start <= len(segment.codes) < start + len(fields[b"codes"]):
            segment.codes += fields[b"codes"][len(segment.codes) - start :]
    return segments

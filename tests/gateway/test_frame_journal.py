"""The frame journal against a real redis-server: a run's codec frames as another process reads them to continue
it, whole even where two processes both wrote the run in chunks of different sizes."""

from __future__ import annotations

import numpy as np
import pytest

from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.frames import FrameJournal

FRAME_BYTES = 4  # two int16 codes a frame: small enough to read the offsets in a failure


def _frames(start: int, stop: int) -> bytes:
    """Frames `[start, stop)`; frame i's codes are (i, -i), so a misplaced frame shows."""
    return np.array([(i, -i) for i in range(start, stop)], dtype="<i2").tobytes()


@pytest.fixture
async def journal(redis_url):
    client = open_redis(redis_url)
    yield FrameJournal(client, ttl_s=600)
    await client.aclose()


async def test_one_writer_s_segments_read_back_whole_and_finished(journal):
    await journal.append("one-writer", 0, 0, _frames(0, 3))
    await journal.append("one-writer", 1, 0, _frames(0, 2))
    await journal.append("one-writer", 0, 3, _frames(3, 5))
    await journal.finish("one-writer", 0, 5)
    segments = await journal.read("one-writer", 2, FRAME_BYTES)
    assert [(s.codes, s.is_finished) for s in segments] == [(_frames(0, 5), True), (_frames(0, 2), False)]


async def test_two_writers_in_chunks_of_different_sizes_read_as_one_run(journal):
    """A process that lost the run to another wrote one chunk more (frames 4..7) before it stopped; the process that
    took the run over wrote frames 4.. of the same (seeded) run in chunks of 2. Every frame counts once; none is
    lost where the chunks' boundaries differ."""
    await journal.append("two-writers", 0, 0, _frames(0, 4))
    writes = [(4, 7), (4, 6), (6, 8), (8, 10), (10, 12)]
    for start, stop in writes:
        await journal.append("two-writers", 0, start, _frames(start, stop))
    await journal.finish("two-writers", 0, 12)
    [segment] = await journal.read("two-writers", 1, FRAME_BYTES)
    assert segment.codes == _frames(0, 12)
    assert segment.is_finished


async def test_a_gap_stops_the_frames_and_the_segment_is_not_finished(journal):
    """Frames past a gap cannot be placed: the continuing process makes them again."""
    await journal.append("gap", 0, 0, _frames(0, 2))
    await journal.append("gap", 0, 3, _frames(3, 5))
    await journal.finish("gap", 0, 5)
    [segment] = await journal.read("gap", 1, FRAME_BYTES)
    assert segment.codes == _frames(0, 2) and not segment.is_finished

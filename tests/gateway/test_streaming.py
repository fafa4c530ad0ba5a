"""Journal entries → what clients receive: a stream that stops without its end marker is never taken for whole."""

from __future__ import annotations

import pytest

from chorus.gateway.state.journal import JournalEntry
from chorus.gateway.streaming import StreamEnded, as_bytes, as_speak_outputs, as_sse

CHUNKS = [JournalEntry(0, b"ab"), JournalEntry(1, b"cd")]
DONE = JournalEntry(2, b"", final={"status": "done", "error": None, "usage": {"audio_s": 0.1}})


async def entries(items):
    for item in items:
        yield item


async def collect(stream):
    return [item async for item in stream]


async def test_a_stream_with_its_end_marker_ends_cleanly():
    assert await collect(as_bytes(entries([*CHUNKS, DONE]))) == [b"ab", b"cd"]
    events = await collect(as_sse(entries([*CHUNKS, DONE])))
    assert b"speech.audio.done" in events[-1]
    outputs = await collect(as_speak_outputs("r1", "speech", entries([*CHUNKS, DONE])))
    assert outputs[0].request_id == "r1" and outputs[-1].HasField("final")


@pytest.mark.parametrize("convert", [as_bytes, as_sse, lambda items: as_speak_outputs("r1", "speech", items)])
async def test_a_stream_that_stops_without_its_end_marker_raises(convert):
    received = []
    with pytest.raises(StreamEnded, match="without its end marker"):
        async for item in convert(entries(CHUNKS)):
            received.append(item)
    assert len(received) >= len(CHUNKS)  # the audio it had went out first

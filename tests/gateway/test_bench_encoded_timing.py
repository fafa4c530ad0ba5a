"""How `chorus bench tts` credits the pieces of an encoded response with audio: each gets the packets it made
playable, a container header none, so TTFP and the simulated player start at the first audio. The pieces here
are what the gateway's own encoder returned per chunk, as a streaming response sends them."""

from __future__ import annotations

import numpy as np
import pytest

from chorus.bench.tts import Response, run_level, seconds_per_piece
from chorus.gateway.audio.encoder import StreamingEncoder

RATE_HZ = 24_000
CHUNK_S = 0.08


def encoded_in_pieces(format_name: str, num_chunks: int) -> tuple[bytes, list[int], list[float]]:
    """The file, its pieces' sizes (the encoder's non-empty outputs), and the audio seconds fed before each."""
    encoder = StreamingEncoder(format_name, RATE_HZ)
    rng = np.random.default_rng(0)
    pieces, fed_s = [], []
    for index in range(num_chunks):
        piece = encoder.encode(rng.uniform(-0.5, 0.5, round(CHUNK_S * RATE_HZ)).astype(np.float32))
        if piece:
            pieces.append(piece)
            fed_s.append((index + 1) * CHUNK_S)
    pieces.append(encoder.flush())
    fed_s.append(num_chunks * CHUNK_S)
    return b"".join(pieces), [len(piece) for piece in pieces], fed_s


@pytest.mark.parametrize("format_name", ["opus", "mp3", "aac", "flac", "wav"])
def test_each_piece_is_credited_the_audio_it_made_playable(format_name):
    data, sizes, fed_s = encoded_in_pieces(format_name, num_chunks=20)
    seconds = seconds_per_piece(data, sizes)
    assert len(seconds) == len(sizes)
    # Every packet is credited once: the file's duration, give or take the codec's padding to whole frames.
    assert sum(seconds) == pytest.approx(20 * CHUNK_S, abs=0.1)
    # No piece is credited audio that had not been fed to the encoder when it was sent (the codec's priming
    # and padding to whole frames aside, which packet durations count).
    credited_s = np.cumsum(seconds)
    assert all(credited <= fed + 0.1 for credited, fed in zip(credited_s, fed_s, strict=True)), (credited_s, fed_s)
    # The stream plays on as it arrives: most pieces carry audio. A container's header (Ogg's, sent before any
    # audio) carries none.
    assert sum(1 for s in seconds if s > 0) >= len(sizes) // 2, seconds
    if format_name == "opus":
        assert data.startswith(b"OggS") and seconds[0] == 0, seconds


async def test_a_level_reads_its_encoded_responses_after_its_last_request(monkeypatch):
    """Demuxing is the client's work, not the server's: a closed loop that did it between requests would send each
    next request late, so a level reads its responses only once every request has ended."""
    data, sizes, _ = encoded_in_pieces("mp3", num_chunks=12)
    events = []

    async def send(index: int) -> Response:
        response = Response("mp3")
        offset = 0
        for size in sizes:
            response.arrived(data[offset : offset + size])
            offset += size
        events.append("request")
        return response.finish()

    timed = Response.timed
    monkeypatch.setattr(Response, "timed", lambda response: events.append("read") or timed(response))
    summary, timings = await run_level(send, concurrency=2, num_requests=4, on_done=lambda: None)
    assert events == ["request"] * 4 + ["read"] * 4
    assert summary["completed"] == 4
    assert all(timing.audio_s == pytest.approx(12 * CHUNK_S, abs=0.1) for timing in timings)

"""Streaming encoders: every format, fed chunk by chunk, decodes (PyAV) as one valid file."""

from __future__ import annotations

import asyncio
import io
import struct

import av
import numpy as np
import pytest

from chorus.gateway.audio import FORMATS, StreamingEncoder
from chorus.gateway.audio.tempo import atempo_factors

SPEECH = (24_000, 1)  # Qwen3-TTS: 24 kHz mono
MUSIC = (44_100, 2)  # Stable Audio Open: 44.1 kHz stereo
CHUNK_S = 0.08  # one 12 Hz codec frame is ~83 ms


def tone(sample_rate_hz: int, num_channels: int, duration_s: float, seed: int = 0) -> np.ndarray:
    """(num_samples, num_channels) float32: a tone plus a little noise, so codecs have content."""
    generator = np.random.default_rng(seed)
    t = np.arange(int(duration_s * sample_rate_hz)) / sample_rate_hz
    channels = [0.4 * np.sin(2 * np.pi * (330 + 110 * c) * t) for c in range(num_channels)]
    samples = np.stack(channels, axis=1) + 0.01 * generator.standard_normal((t.size, num_channels))
    return samples.astype(np.float32)


def encode_in_chunks(encoder: StreamingEncoder, samples: np.ndarray) -> list[bytes]:
    chunk = int(CHUNK_S * encoder.sample_rate_hz)
    parts = [encoder.encode(samples[i : i + chunk]) for i in range(0, len(samples), chunk)]
    return [*parts, encoder.flush()]


def decode(data: bytes, format_name: str) -> tuple[int, int, np.ndarray]:
    """(sample_rate_hz, num_channels, samples as (num_channels, num_samples) float)."""
    with av.open(io.BytesIO(data), format="s16le" if format_name == "pcm" else None) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray() for frame in container.decode(stream)]
        rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
    samples = np.concatenate([f if f.shape[0] == channels else f.reshape(-1, channels).T for f in frames], axis=1)
    return rate, channels, samples


# Decoders report opus at 48 kHz whatever the encoder's input rate (RFC 7845).
def expected_rate_hz(format_name: str, sample_rate_hz: int) -> int:
    return 48_000 if format_name == "opus" else sample_rate_hz


@pytest.mark.parametrize("layout", [SPEECH, MUSIC], ids=["speech", "music"])
@pytest.mark.parametrize("format_name", sorted(set(FORMATS) - {"pcm"}))
def test_chunked_stream_decodes_with_right_rate_and_duration(format_name, layout):
    sample_rate_hz, num_channels = layout
    samples = tone(sample_rate_hz, num_channels, duration_s=1.5)
    encoder = StreamingEncoder(format_name, sample_rate_hz, num_channels)
    parts = encode_in_chunks(encoder, samples)

    rate, channels, decoded = decode(b"".join(parts), format_name)
    assert rate == expected_rate_hz(format_name, sample_rate_hz)
    assert channels == num_channels
    # mp3 and aac add encoder delay/padding (at most a frame or two); lossless formats are exact.
    assert decoded.shape[1] / rate == pytest.approx(1.5, abs=0.1)
    assert np.abs(decoded).max() > 0.2  # real audio came through, not silence


def test_bytes_leave_before_the_end_of_the_stream():
    for format_name in ("mp3", "opus", "aac", "wav", "pcm"):
        encoder = StreamingEncoder(format_name, *SPEECH)
        parts = encode_in_chunks(encoder, tone(*SPEECH, duration_s=2.0))
        num_bytes_before_flush = sum(len(p) for p in parts[:-1])
        assert num_bytes_before_flush > 0.5 * sum(len(p) for p in parts), format_name


def test_pcm_is_raw_int16_little_endian():
    samples = tone(*SPEECH, duration_s=0.5)
    encoder = StreamingEncoder("pcm", *SPEECH)
    data = b"".join(encode_in_chunks(encoder, samples))
    assert len(data) == 2 * len(samples)
    expected = np.round(samples[:, 0] * 32768).astype(np.int16)
    assert np.abs(np.frombuffer(data, "<i2").astype(int) - expected).max() <= 1


def test_int16_input_round_trips_through_wav_and_flac_exactly():
    generator = np.random.default_rng(1)
    samples = generator.integers(-20_000, 20_000, size=(12_000, 2), dtype=np.int16)
    for format_name in ("wav", "flac"):
        encoder = StreamingEncoder(format_name, 44_100, 2)
        _, _, decoded = decode(b"".join(encode_in_chunks(encoder, samples)), format_name)
        assert np.array_equal(decoded.T, samples), format_name


def test_wav_header_declares_unknown_length():
    data = StreamingEncoder("wav", *SPEECH).encode(tone(*SPEECH, duration_s=0.1))
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
    assert data[36:40] == b"data" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<HHI", data[20:28]) == (1, 1, 24_000)


@pytest.mark.parametrize("speed", [0.5, 2.0, 4.0])
@pytest.mark.parametrize("format_name", ["mp3", "wav"])
def test_speed_changes_duration_not_rate(format_name, speed):
    encoder = StreamingEncoder(format_name, *SPEECH, speed=speed)
    rate, _, decoded = decode(b"".join(encode_in_chunks(encoder, tone(*SPEECH, duration_s=2.0))), format_name)
    assert rate == 24_000
    assert decoded.shape[1] / rate == pytest.approx(2.0 / speed, abs=0.1)


def test_speed_is_split_into_atempo_range_and_checked():
    assert np.prod(atempo_factors(0.25)) == pytest.approx(0.25)
    assert all(0.5 <= f <= 2.0 for f in atempo_factors(4.0))
    for bad in (0.2, 4.5, 0.0):
        with pytest.raises(ValueError, match="speed"):
            StreamingEncoder("mp3", *SPEECH, speed=bad)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="response_format"):
        StreamingEncoder("ogg", *SPEECH)
    encoder = StreamingEncoder("wav", 24_000, 1)
    with pytest.raises(ValueError, match="samples"):
        encoder.encode(np.zeros((10, 2), np.float32))
    with pytest.raises(ValueError, match="samples"):
        encoder.encode(np.zeros(10, np.int64))


def test_close_without_flush_releases_the_codec():
    encoder = StreamingEncoder("aac", *SPEECH)
    encoder.encode(tone(*SPEECH, duration_s=0.2))
    encoder.close()


@pytest.mark.parametrize(("format_name", "speed"), [("mp3", 1.0), ("flac", 1.0), ("pcm", 1.5), ("pcm", 1.0)])
async def test_async_encoding_gives_the_same_bytes(format_name, speed):
    samples = tone(*SPEECH, 1.0)
    chunk = int(CHUNK_S * SPEECH[0])
    inline = StreamingEncoder(format_name, *SPEECH, speed=speed)
    threaded = StreamingEncoder(format_name, *SPEECH, speed=speed)
    expected = encode_in_chunks(inline, samples)
    got = [await threaded.encode_async(samples[i : i + chunk]) for i in range(0, len(samples), chunk)]
    assert [*got, await threaded.flush_async()] == expected


async def test_close_waits_for_an_encode_running_in_its_thread():
    encoder = StreamingEncoder("mp3", *MUSIC)
    running = asyncio.ensure_future(encoder.encode_async(tone(*MUSIC, 10.0)))
    await asyncio.sleep(0)  # the worker thread has the chunk
    running.cancel()  # as a cancelled request: its stream closes the encoder at once
    encoder.close()  # blocks until the thread's encode is done: PyAV must not close a codec in use
    assert (await asyncio.gather(running, return_exceptions=True))[0].__class__ is asyncio.CancelledError
    with pytest.raises(AssertionError, match="encode after flush"):
        encoder.encode(tone(*MUSIC, 0.1))

"""Uploaded audio → 24 kHz mono float32, and the errors for audio the encoder must refuse."""

from __future__ import annotations

import io
import math

import av
import numpy as np
import pytest

from chorus.vocoder.audio_io import AudioInputError, decode_audio, to_pcm_f32le, to_pcm_s16le


def _encode_file(container_format: str, codec: str, rate_hz: int, channels: list[np.ndarray]) -> bytes:
    """Writes `channels` (float in [-1, 1]) as an audio file with PyAV."""
    buffer = io.BytesIO()
    layout = "mono" if len(channels) == 1 else "stereo"
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate_hz)
        stream.layout = layout
        stream.format = "s16"
        samples = (np.stack(channels) * 32767).astype(np.int16)
        if samples.shape[1]:
            frame = av.AudioFrame.from_ndarray(samples.T.reshape(1, -1).copy(), format="s16", layout=layout)
            frame.sample_rate = rate_hz
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buffer.getvalue()


def _sine(frequency_hz: float, rate_hz: int, duration_s: float) -> np.ndarray:
    t = np.arange(int(rate_hz * duration_s)) / rate_hz
    return 0.5 * np.sin(2 * math.pi * frequency_hz * t)


def _peak_frequency_hz(waveform: np.ndarray, rate_hz: int) -> float:
    spectrum = np.abs(np.fft.rfft(waveform))
    return float(np.argmax(spectrum) * rate_hz / waveform.size)


@pytest.mark.parametrize(
    ("container_format", "codec", "rate_hz", "num_channels"),
    [("wav", "pcm_s16le", 44100, 2), ("wav", "pcm_s16le", 16000, 1), ("flac", "flac", 48000, 2)],
)
def test_resamples_and_downmixes(container_format, codec, rate_hz, num_channels):
    tone = _sine(440.0, rate_hz, 1.5)
    data = _encode_file(container_format, codec, rate_hz, [tone] * num_channels)
    waveform = decode_audio(data, sample_rate_hz=24000, max_duration_s=10)
    assert waveform.dtype == np.float32 and waveform.ndim == 1
    assert abs(waveform.size - 1.5 * 24000) <= 64
    assert abs(_peak_frequency_hz(waveform, 24000) - 440.0) < 2.0
    assert 0.3 < np.abs(waveform).max() < 0.6


def test_rejects_empty_bytes():
    with pytest.raises(AudioInputError, match="reference_audio: empty"):
        decode_audio(b"", sample_rate_hz=24000, max_duration_s=10, field="reference_audio")


def test_rejects_undecodable_bytes():
    with pytest.raises(AudioInputError, match="audio: cannot decode"):
        decode_audio(b"RIFF....not really a wav file" * 10, sample_rate_hz=24000, max_duration_s=10)


def test_rejects_too_long_audio():
    data = _encode_file("wav", "pcm_s16le", 24000, [_sine(200.0, 24000, 3.0)])
    with pytest.raises(AudioInputError, match="longer than the 2 s limit"):
        decode_audio(data, sample_rate_hz=24000, max_duration_s=2)


def test_rejects_audio_without_samples():
    data = _encode_file("wav", "pcm_s16le", 24000, [np.zeros(0)])
    with pytest.raises(AudioInputError, match="audio: "):
        decode_audio(data, sample_rate_hz=24000, max_duration_s=10)


def test_is_a_value_error_for_the_error_boundary():
    assert issubclass(AudioInputError, ValueError)


def test_pcm_bytes():
    waveform = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5], dtype=np.float32)
    s16 = np.frombuffer(to_pcm_s16le(waveform), dtype="<i2")
    np.testing.assert_array_equal(s16, [0, 16384, -16384, 32767, -32767, 32767])
    np.testing.assert_array_equal(np.frombuffer(to_pcm_f32le(waveform), dtype="<f4"), waveform)

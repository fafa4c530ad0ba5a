"""Decodes uploaded reference audio (wav, flac, mp3, ogg, … in any common rate and layout) to the codec's input:
mono float32 at the codec's sample rate. PyAV (FFmpeg's swresample) resamples; channels are averaged, as the
reference does (swresample's own downmix would scale stereo by 1/√2 instead of 1/2)."""

from __future__ import annotations

import io

import av
import numpy as np

from chorus.runtime.errors import InvalidRequest


class AudioInputError(InvalidRequest):
    """Uploaded audio that is empty, too long or cannot be decoded (INVALID_ARGUMENT)."""


def decode_audio(data: bytes, *, sample_rate_hz: int, max_duration_s: float, field: str = "audio") -> np.ndarray:
    """`data`, an audio file, → (num_samples,) float32 mono at `sample_rate_hz`.

    Raises AudioInputError naming `field` when the audio is empty, longer than `max_duration_s` or undecodable.
    """
    if not data:
        raise AudioInputError(f"{field}: empty")
    max_samples = int(max_duration_s * sample_rate_hz)
    pieces: list[np.ndarray] = []
    num_samples = 0
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioInputError(f"{field}: the file has no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="fltp", layout=stream.layout, rate=sample_rate_hz)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().mean(axis=0))
                    num_samples += pieces[-1].size
                if num_samples > max_samples:
                    raise AudioInputError(f"{field}: longer than the {max_duration_s:g} s limit")
            pieces.extend(out.to_ndarray().mean(axis=0) for out in resampler.resample(None))
    except (av.FFmpegError, ValueError, EOFError) as exc:
        if isinstance(exc, AudioInputError):
            raise
        raise AudioInputError(f"{field}: cannot decode the audio ({type(exc).__name__})") from exc
    waveform = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    if waveform.size == 0:
        raise AudioInputError(f"{field}: contains no samples")
    if waveform.size > max_samples:
        raise AudioInputError(f"{field}: longer than the {max_duration_s:g} s limit")
    return waveform.astype(np.float32, copy=False)


def to_pcm_s16le(waveform: np.ndarray) -> bytes:
    """(num_samples,) float in [-1, 1] → int16 little-endian bytes (rounded, saturated)."""
    scaled = np.rint(np.clip(waveform, -1.0, 1.0) * 32767.0)
    return scaled.astype("<i2").tobytes()


def to_pcm_f32le(waveform: np.ndarray) -> bytes:
    """(num_samples,) float → float32 little-endian bytes."""
    return np.asarray(waveform, dtype="<f4").tobytes()

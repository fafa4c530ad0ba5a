"""Reference audio (an uploaded file) → codec codes, for Base voice clone (`Vocoder.Encode`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from chorus.vocoder.audio_io import decode_audio
from chorus.vocoder.models.codec_encoder import CodecEncoder


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedAudio:
    codes: np.ndarray  # (num_frames, num_quantizers) int64, frame-major
    audio_s: float  # duration of the decoded input


def encode_audio_bytes(
    encoder: CodecEncoder, data: bytes, *, sample_rate_hz: int, max_duration_s: float
) -> EncodedAudio:
    """Decodes, resamples and downmixes `data`, then encodes it. Raises AudioInputError for bad audio."""
    waveform = decode_audio(data, sample_rate_hz=sample_rate_hz, max_duration_s=max_duration_s)
    device = next(encoder.parameters()).device
    codes = encoder(torch.from_numpy(waveform)[None].to(device))[0]
    return EncodedAudio(codes.cpu().numpy(), waveform.size / sample_rate_hz)

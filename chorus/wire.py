"""Conversions between the wire messages that carry arrays (CodecChunk, PcmChunk) and numpy."""

from __future__ import annotations

import numpy as np

from chorus.runtime.errors import InvalidRequest
from chorus.v1 import common_pb2

_PCM_DTYPES = {common_pb2.SAMPLE_FORMAT_PCM_S16LE: np.dtype("<i2"), common_pb2.SAMPLE_FORMAT_PCM_F32LE: np.dtype("<f4")}


def codes_to_chunk(codes: np.ndarray, sequence: int, frame_offset: int) -> common_pb2.CodecChunk:
    """(num_frames, num_codebooks) integer codes → a CodecChunk of int16 little-endian, frame-major."""
    num_frames, num_codebooks = codes.shape
    return common_pb2.CodecChunk(
        codes=np.ascontiguousarray(codes, dtype="<i2").tobytes(),
        num_frames=num_frames,
        num_codebooks=num_codebooks,
        sequence=sequence,
        frame_offset=frame_offset,
    )


def chunk_to_codes(chunk: common_pb2.CodecChunk, field: str = "chunk") -> np.ndarray:
    """A CodecChunk → (num_frames, num_codebooks) int64 codes; a malformed chunk raises InvalidRequest."""
    expected_bytes = 2 * chunk.num_frames * chunk.num_codebooks
    if chunk.num_codebooks == 0 or len(chunk.codes) != expected_bytes:
        raise InvalidRequest(
            f"{field}: {len(chunk.codes)} bytes of codes do not hold {chunk.num_frames} frames × "
            f"{chunk.num_codebooks} codebooks of int16"
        )
    codes = np.frombuffer(chunk.codes, dtype="<i2").reshape(chunk.num_frames, chunk.num_codebooks)
    return codes.astype(np.int64)


def pcm_to_chunk(
    waveform: np.ndarray, sample_rate_hz: int, sample_format: int, sequence: int, sample_offset: int
) -> common_pb2.PcmChunk:
    """Float samples in [-1, 1], (num_samples,) or (num_samples, num_channels) → a PcmChunk."""
    frames = waveform.reshape(waveform.shape[0], -1)
    if sample_format == common_pb2.SAMPLE_FORMAT_PCM_F32LE:
        data = np.ascontiguousarray(frames, dtype="<f4").tobytes()
    else:
        sample_format = common_pb2.SAMPLE_FORMAT_PCM_S16LE
        data = (np.clip(frames, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
    return common_pb2.PcmChunk(
        data=data,
        sample_rate_hz=sample_rate_hz,
        num_channels=frames.shape[1],
        format=sample_format,
        sequence=sequence,
        sample_offset=sample_offset,
    )


def chunk_to_pcm(chunk: common_pb2.PcmChunk) -> np.ndarray:
    """A PcmChunk → (num_samples, num_channels) int16 or float32 samples, as sent."""
    dtype = _PCM_DTYPES.get(chunk.format, _PCM_DTYPES[common_pb2.SAMPLE_FORMAT_PCM_S16LE])
    return np.frombuffer(chunk.data, dtype=dtype).reshape(-1, max(1, chunk.num_channels))

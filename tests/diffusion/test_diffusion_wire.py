"""Proto ↔ engine conversions of the Diffusion.Generate contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.diffusion.engine.request import (
    AudioOutput,
    Finished,
    FinishReason,
    InvalidGenerationParameter,
    RequestLimits,
    SampleFormat,
    StepProgress,
)
from chorus.diffusion.wire import generation_request, output_messages
from chorus.v1 import common_pb2, diffusion_pb2

LIMITS = RequestLimits(max_duration_s=47.55, max_num_outputs=4)


def test_request_fields_and_defaults():
    message = diffusion_pb2.GenerateRequest(
        request_id="r1",
        prompt="rain",
        negative_prompt="hiss",
        duration_s=5.0,
        start_s=1.0,
        num_steps=50,
        guidance_scale=1.0,
        seed=0,
        num_outputs=2,
    )
    request = generation_request(LIMITS, message, deadline_s=123.0)
    assert (request.prompt, request.negative_prompt, request.duration_s, request.start_s) == ("rain", "hiss", 5.0, 1.0)
    assert (request.num_steps, request.guidance_scale, request.seed, request.num_outputs) == (50, 1.0, 0, 2)
    assert request.deadline_s == 123.0
    defaults = generation_request(LIMITS, diffusion_pb2.GenerateRequest(request_id="r2", prompt="rain"))
    assert defaults.guidance_scale == 7.0 and defaults.num_steps == 100 and defaults.duration_s == 10.0
    assert defaults.negative_prompt is None


def test_sample_format_defaults_to_float32():
    formats = {
        common_pb2.SAMPLE_FORMAT_UNSPECIFIED: SampleFormat.F32,
        common_pb2.SAMPLE_FORMAT_PCM_F32LE: SampleFormat.F32,
        common_pb2.SAMPLE_FORMAT_PCM_S16LE: SampleFormat.S16,
    }
    for wire_format, sample_format in formats.items():
        message = diffusion_pb2.GenerateRequest(request_id="r", prompt="x", sample_format=wire_format)
        assert generation_request(LIMITS, message).sample_format is sample_format


@pytest.mark.parametrize(("field", "value"), [("duration_s", 48.0), ("sample_format", 7)])
def test_bad_request_names_the_field(field, value):
    with pytest.raises(InvalidGenerationParameter) as raised:
        generation_request(LIMITS, diffusion_pb2.GenerateRequest(request_id="r", prompt="x", **{field: value}))
    assert raised.value.field == field


def test_int16_audio_goes_as_s16le_chunks_of_whole_frames():
    waveform = torch.randint(-32768, 32768, (1001, 2), dtype=torch.int16).T  # interleaved, as the runner's
    messages = list(output_messages(AudioOutput(index=0, waveform=waveform, sample_rate_hz=44100), 3001))
    pcms = [m.audio.pcm for m in messages]
    assert all(p.format == common_pb2.SAMPLE_FORMAT_PCM_S16LE and p.num_channels == 2 for p in pcms)
    assert [p.sample_offset for p in pcms] == [0, 750] and len(pcms[0].data) == 3000
    samples = np.frombuffer(b"".join(p.data for p in pcms), dtype="<i2").reshape(-1, 2).T
    assert np.array_equal(samples, waveform.numpy())


def test_audio_is_split_into_ordered_chunks():
    waveform = torch.randn(2, 1001)
    messages = list(output_messages(AudioOutput(index=1, waveform=waveform, sample_rate_hz=44100), 3000))
    assert len(messages) == 3 and all(m.audio.index == 1 for m in messages)
    pcms = [m.audio.pcm for m in messages]
    assert [p.sequence for p in pcms] == [0, 1, 2]
    assert [p.sample_offset for p in pcms] == [0, 375, 750]
    assert all(p.num_channels == 2 and p.format == common_pb2.SAMPLE_FORMAT_PCM_F32LE for p in pcms)
    samples = np.frombuffer(b"".join(p.data for p in pcms), dtype="<f4").reshape(-1, 2).T
    assert np.array_equal(samples, waveform.numpy())


@pytest.mark.parametrize(("num_samples", "index", "max_chunk_bytes"), [(1001, 0, 3000), (1001, 1, 8000), (0, 0, 3000)])
def test_audio_messages_are_the_bytes_of_nested_construction(num_samples, index, max_chunk_bytes):
    """Messages filled in place serialize exactly as those built by passing each PcmChunk to Audio(pcm=...), from a
    row-major waveform or an interleaved one."""
    waveform = torch.randn(2, num_samples)
    data = np.ascontiguousarray(waveform.numpy().T, dtype="<f4").tobytes()
    chunk_bytes = max_chunk_bytes - max_chunk_bytes % 8
    expected = [
        diffusion_pb2.GenerateOutput(audio=diffusion_pb2.Audio(index=index, pcm=common_pb2.PcmChunk(
            data=data[offset : offset + chunk_bytes], sample_rate_hz=44100, num_channels=2,
            format=common_pb2.SAMPLE_FORMAT_PCM_F32LE, sequence=sequence, sample_offset=offset // 8,
        ))).SerializeToString()
        for sequence, offset in enumerate(range(0, max(len(data), 1), chunk_bytes))
    ]  # fmt: skip
    for layout in (waveform, waveform.T.contiguous().T):
        messages = output_messages(AudioOutput(index=index, waveform=layout, sample_rate_hz=44100), max_chunk_bytes)
        assert [message.SerializeToString() for message in messages] == expected


def test_progress_and_final():
    (progress,) = output_messages(StepProgress(step=3, num_steps=10))
    assert (progress.progress.step, progress.progress.num_steps) == (3, 10)
    finished = Finished(FinishReason.ERROR, 4, 0.0, 7, 1.0, 2.0, 3.0, "DEADLINE_EXCEEDED", "too late")
    (final,) = output_messages(finished)
    assert final.final.reason == common_pb2.FINISH_REASON_ERROR
    assert final.final.error.code == "DEADLINE_EXCEEDED" and final.final.usage.num_steps == 4
    assert final.final.usage.input_tokens == 7 and final.final.usage.timings.total_ms == 3.0
    (complete,) = output_messages(Finished(FinishReason.COMPLETE, 10, 2.5, 7, 1.0, 2.0, 3.0))
    assert complete.final.reason == common_pb2.FINISH_REASON_COMPLETE and not complete.final.HasField("error")

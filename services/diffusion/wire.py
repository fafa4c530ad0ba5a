"""Conversions between `chorus.v1` diffusion messages and engine requests and events (no I/O, no gRPC).

A servicer is then: `request = generation_request(engine.limits, message, deadline_s)`, then for each
event of `engine.generate(request)`, send every message of `output_messages(event)`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from chorus.diffusion.engine.request import (
    AudioOutput,
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    InvalidGenerationParameter,
    RequestLimits,
    SampleFormat,
    StepProgress,
    validate_request,
)
from chorus.v1 import common_pb2, diffusion_pb2

# A full 47.55 s stereo float32 window is exactly 16 MiB, the default message limit, so audio is split.
MAX_AUDIO_CHUNK_BYTES = 4 * 1024 * 1024

_SAMPLE_FORMATS = {
    common_pb2.SAMPLE_FORMAT_UNSPECIFIED: SampleFormat.F32,
    common_pb2.SAMPLE_FORMAT_PCM_F32LE: SampleFormat.F32,
    common_pb2.SAMPLE_FORMAT_PCM_S16LE: SampleFormat.S16,
}
_PCM_FORMATS = {torch.float32: common_pb2.SAMPLE_FORMAT_PCM_F32LE, torch.int16: common_pb2.SAMPLE_FORMAT_PCM_S16LE}

_FINISH_REASONS = {
    FinishReason.COMPLETE: common_pb2.FINISH_REASON_COMPLETE,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def generation_request(
    limits: RequestLimits, message: diffusion_pb2.GenerateRequest, deadline_s: float | None = None
) -> GenerationRequest:
    """Validates a GenerateRequest (raises InvalidGenerationParameter naming the field); deadline_s is on
    the time.monotonic() clock, e.g. time.monotonic() + context.time_remaining()."""
    if message.sample_format not in _SAMPLE_FORMATS:
        raise InvalidGenerationParameter(
            "sample_format", f"must be PCM_S16LE or PCM_F32LE, got {message.sample_format}"
        )
    return validate_request(
        limits,
        request_id=message.request_id,
        prompt=message.prompt,
        negative_prompt=message.negative_prompt or None,
        duration_s=message.duration_s,
        start_s=message.start_s,
        num_steps=message.num_steps,
        guidance_scale=message.guidance_scale if message.HasField("guidance_scale") else None,
        seed=message.seed if message.HasField("seed") else None,
        num_outputs=message.num_outputs,
        deadline_s=deadline_s,
        sample_format=_SAMPLE_FORMATS[message.sample_format],
    )


def output_messages(
    event: Event, max_chunk_bytes: int = MAX_AUDIO_CHUNK_BYTES
) -> Iterator[diffusion_pb2.GenerateOutput]:
    """The GenerateOutput messages of one engine event. An output's audio may span several Audio messages
    with the same index, consecutive PcmChunk sequence numbers and sample offsets."""
    if isinstance(event, StepProgress):
        yield diffusion_pb2.GenerateOutput(progress=common_pb2.Progress(step=event.step, num_steps=event.num_steps))
    elif isinstance(event, AudioOutput):
        yield from _audio_messages(event, max_chunk_bytes)
    else:
        yield diffusion_pb2.GenerateOutput(final=_final(event))


def _audio_messages(event: AudioOutput, max_chunk_bytes: int) -> Iterator[diffusion_pb2.GenerateOutput]:
    data = event.interleaved_bytes()
    num_channels = event.waveform.shape[0]
    frame_bytes = event.waveform.element_size() * num_channels
    chunk_bytes = max(frame_bytes, max_chunk_bytes - max_chunk_bytes % frame_bytes)
    for sequence, offset_bytes in enumerate(range(0, max(len(data), 1), chunk_bytes)):
        # Filled in place: a PcmChunk passed to Audio(pcm=...) is merged in, a copy that took 4.6 ms per 3.5 MB.
        message = diffusion_pb2.GenerateOutput()
        message.audio.index = event.index
        pcm = message.audio.pcm
        pcm.data = data[offset_bytes : offset_bytes + chunk_bytes]
        pcm.sample_rate_hz = event.sample_rate_hz
        pcm.num_channels = num_channels
        pcm.format = _PCM_FORMATS[event.waveform.dtype]
        pcm.sequence = sequence
        pcm.sample_offset = offset_bytes // frame_bytes
        yield message


def _final(event: Finished) -> common_pb2.Final:
    final = common_pb2.Final(
        reason=_FINISH_REASONS[event.reason],
        usage=common_pb2.Usage(
            input_tokens=event.num_prompt_tokens,
            audio_s=event.audio_s,
            num_steps=event.num_steps_run,
            timings=common_pb2.Timings(
                queue_ms=event.queue_ms, first_output_ms=event.first_output_ms, total_ms=event.total_ms
            ),
        ),
    )
    if event.error_code is not None:
        final.error.CopyFrom(common_pb2.Error(code=event.error_code, message=event.error_message or ""))
    return final

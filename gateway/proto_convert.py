"""Public gRPC messages ↔ the REST schemas, so both APIs share one validation and one view."""

from __future__ import annotations

import base64

import pydantic

from chorus.gateway.errors import invalid_param_from
from chorus.gateway.schemas import CreateVoiceRequest, GenerationRequest, SpeechRequest
from chorus.gateway.state.requests import RequestRecord
from chorus.gateway.state.voices import Voice
from chorus.v1 import common_pb2, gateway_pb2, talker_pb2

_FORMATS = {
    gateway_pb2.AUDIO_FORMAT_UNSPECIFIED: "mp3",
    gateway_pb2.AUDIO_FORMAT_MP3: "mp3",
    gateway_pb2.AUDIO_FORMAT_OPUS: "opus",
    gateway_pb2.AUDIO_FORMAT_AAC: "aac",
    gateway_pb2.AUDIO_FORMAT_FLAC: "flac",
    gateway_pb2.AUDIO_FORMAT_WAV: "wav",
    gateway_pb2.AUDIO_FORMAT_PCM: "pcm",
}
_TASK_TYPES = {
    talker_pb2.TASK_TYPE_UNSPECIFIED: None,
    talker_pb2.TASK_TYPE_CUSTOM_VOICE: "custom_voice",
    talker_pb2.TASK_TYPE_VOICE_DESIGN: "voice_design",
    talker_pb2.TASK_TYPE_VOICE_CLONE: "voice_clone",
}
_VOICE_TASK_TYPES = {
    "builtin": talker_pb2.TASK_TYPE_CUSTOM_VOICE,
    "clone": talker_pb2.TASK_TYPE_VOICE_CLONE,
    "design": talker_pb2.TASK_TYPE_VOICE_DESIGN,
}
_STATES = {
    "queued": gateway_pb2.REQUEST_STATE_QUEUED,
    "running": gateway_pb2.REQUEST_STATE_RUNNING,
    "done": gateway_pb2.REQUEST_STATE_DONE,
    "failed": gateway_pb2.REQUEST_STATE_FAILED,
    "cancelled": gateway_pb2.REQUEST_STATE_CANCELLED,
}
_SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "subtalker_greedy",
    "subtalker_temperature",
    "subtalker_top_k",
    "subtalker_top_p",
)


def timings(message: common_pb2.Timings) -> dict[str, float]:
    """A service's own timings from its Final, as a record's usage keeps them (ms, one decimal)."""
    return {name: round(getattr(message, name), 1) for name in ("queue_ms", "first_output_ms", "total_ms")}


def task_type_name(task_type: int) -> str:
    """A talker TaskType as the REST API names it (custom_voice, voice_design, voice_clone)."""
    return _TASK_TYPES.get(task_type) or "unspecified"


def _validated(schema: type[pydantic.BaseModel], fields: dict) -> pydantic.BaseModel:
    try:
        return schema.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise invalid_param_from(exc) from None


def _format(value: int) -> str:
    # An enum number this gateway does not know reaches the schema as itself, which refuses it.
    return _FORMATS.get(value, str(value))


def speech_request(message: gateway_pb2.SpeakRequest) -> SpeechRequest:
    """A SpeakRequest as the REST schema (ref_audio stays bytes on the message, checked separately)."""
    fields: dict = {
        "model": message.model,
        "input": message.input,
        "voice": message.voice or None,
        "instructions": message.instructions or None,
        "response_format": _format(message.response_format),
        "speed": message.speed or 1.0,
        "language": message.language or None,
        "task_type": _TASK_TYPES.get(message.task_type, str(message.task_type)),
        # Only presence matters to the schema's cross-field checks; the bytes are checked as audio later.
        "ref_audio": "<bytes>" if message.ref_audio else None,
        "ref_text": message.ref_text or None,
        "x_vector_only": message.x_vector_only,
        # The schema takes the embedding as JSON carries it, base64.
        "speaker_embedding": base64.b64encode(message.speaker_embedding).decode() or None,
        "seed": message.seed if message.HasField("seed") else None,
        "max_frames": message.max_frames or None,
        "ignore_eos": message.ignore_eos,
    }
    if message.HasField("sampling"):
        sampling = {"greedy": message.sampling.greedy}
        sampling |= {
            name: getattr(message.sampling, name) for name in _SAMPLING_FIELDS if message.sampling.HasField(name)
        }
        fields["sampling"] = sampling
    return _validated(SpeechRequest, fields)


def create_voice_request(message: gateway_pb2.CreateVoiceRequest) -> CreateVoiceRequest:
    """A CreateVoiceRequest as the REST schema (the audio stays bytes on the message, checked separately)."""
    fields = {
        "name": message.name,
        "audio": "<bytes>" if message.audio else None,
        "ref_text": message.ref_text or None,
        "language": message.language or None,
        "x_vector_only": message.x_vector_only,
        "instructions": message.instructions or None,
    }
    return _validated(CreateVoiceRequest, fields)


def voice(voice: Voice) -> gateway_pb2.Voice:
    return gateway_pb2.Voice(
        id=voice.voice_id,
        name=voice.name,
        model=voice.model,
        task_type=_VOICE_TASK_TYPES[voice.kind],
        created_at_s=voice.created_at_s or 0.0,
        language=voice.language,
        ref_text=voice.ref_text,
        ref_duration_s=voice.ref_duration_s,
        x_vector_only=voice.x_vector_only,
        instructions=voice.instructions,
    )


def generation_request(message: gateway_pb2.TextToAudioRequest) -> GenerationRequest:
    fields = {
        "model": message.model,
        "prompt": message.prompt,
        "negative_prompt": message.negative_prompt or None,
        "duration_s": message.duration_s or 10.0,
        "num_steps": message.num_steps or None,
        "guidance_scale": message.guidance_scale if message.HasField("guidance_scale") else None,
        "seed": message.seed if message.HasField("seed") else None,
        "response_format": _format(message.response_format),
    }
    return _validated(GenerationRequest, fields)


def request_status(record: RequestRecord) -> gateway_pb2.RequestStatus:
    status = gateway_pb2.RequestStatus(
        request_id=record.request_id,
        kind=record.kind,
        state=_STATES[record.status],
        model=record.model,
        voice=record.voice,
        created_at_s=record.created_at_s,
        started_at_s=record.started_at_s or 0.0,
        finished_at_s=record.finished_at_s or 0.0,
        last_sequence=record.last_sequence or 0,
    )
    if record.usage:
        usage = {k: v for k, v in record.usage.items() if k in ("input_tokens", "num_frames", "audio_s", "num_steps")}
        status.usage.CopyFrom(common_pb2.Usage(**usage))
    if record.progress:
        status.progress.CopyFrom(common_pb2.Progress(**record.progress))
    if record.error:
        error = common_pb2.Error(code=record.error.get("code", ""), message=record.error.get("message", ""))
        status.error.CopyFrom(error)
    return status

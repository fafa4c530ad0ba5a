"""A validated speech request (REST schema) → the talker's SynthesisRequest (text left to the segmenter)."""

from __future__ import annotations

from chorus.gateway.schemas import SpeechRequest
from chorus.v1 import talker_pb2

_TASK_TYPES = {
    None: talker_pb2.TASK_TYPE_UNSPECIFIED,
    "custom_voice": talker_pb2.TASK_TYPE_CUSTOM_VOICE,
    "voice_design": talker_pb2.TASK_TYPE_VOICE_DESIGN,
    "voice_clone": talker_pb2.TASK_TYPE_VOICE_CLONE,
}


def synthesis_request(body: SpeechRequest, voice_clone: talker_pb2.VoiceClone | None) -> talker_pb2.SynthesisRequest:
    """The fields every segment of the request shares; `request_id` and `text` are set per segment."""
    # A reference audio without a task type means cloning, whatever the checkpoint's default is.
    task_type = "voice_clone" if body.task_type is None and voice_clone is not None else body.task_type
    request = talker_pb2.SynthesisRequest(
        task_type=_TASK_TYPES[task_type],
        speaker=body.voice or "",
        language=body.language or "",
        instructions=body.instructions or "",
        seed=body.seed,
        max_frames=body.max_frames or 0,
        ignore_eos=body.ignore_eos,
    )
    if voice_clone is not None:
        request.voice_clone.CopyFrom(voice_clone)
    if body.sampling is not None:
        fields = body.sampling.model_dump(exclude_none=True)
        request.sampling.CopyFrom(talker_pb2.SamplingParams(**fields))
    return request

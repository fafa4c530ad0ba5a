"""Request bodies of the REST API (pydantic), as the OpenAI SDK sends them plus Qwen3-TTS extensions.

Shape errors (missing or unknown fields, wrong JSON types) answer 422; values out of range
answer 400 with `param` naming the field. Limits that operators configure (the `input` length)
are checked by `check_limits` after parsing, since a schema class cannot see the config.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from chorus.gateway.errors import InvalidParam

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
TaskType = Literal["custom_voice", "voice_design", "voice_clone"]
MAX_INSTRUCTIONS_CHARS = 4096
MAX_DIFFUSION_DURATION_S = 47.55  # Stable Audio Open's longest clip
MAX_DIFFUSION_STEPS = 500
MAX_SPEAKER_EMBEDDING_SIZE = 8192  # floats; the talkers' widths are 1024 and 2048
MAX_VOICE_NAME_CHARS = 64


def _speaker_embedding(value: object) -> bytes:
    """Base64 of a float32 little-endian vector → its bytes, checked (the talker checks the width)."""
    if not isinstance(value, str):
        raise ValueError("must be a base64 string")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None
    if not data or len(data) % 4 or len(data) > 4 * MAX_SPEAKER_EMBEDDING_SIZE:
        raise ValueError(f"must be 1 to {MAX_SPEAKER_EMBEDDING_SIZE} float32 values (little-endian), base64-encoded")
    if not np.isfinite(np.frombuffer(data, dtype="<f4")).all():
        raise ValueError("holds a NaN or an infinite value")
    return data


SpeakerEmbedding = Annotated[bytes, BeforeValidator(_speaker_embedding)]


def _voice_reference(value: object) -> object:
    """The OpenAI SDK names a custom voice as `{"id": "voice_…"}`, and must send some voice: "" names none (a
    clone from `ref_audio` or `speaker_embedding`). Any other value is checked as a string."""
    if isinstance(value, dict) and set(value) == {"id"}:
        return value["id"]
    return value or None


class SamplingParams(BaseModel):
    """Talker sampling; unset fields take the checkpoint's generation_config."""

    model_config = ConfigDict(extra="forbid")

    greedy: bool = False
    temperature: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    top_k: Annotated[int, Field(ge=1, le=4096)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    subtalker_greedy: bool | None = None
    subtalker_temperature: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    subtalker_top_k: Annotated[int, Field(ge=1, le=4096)] | None = None
    subtalker_top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None


class SpeechRequest(BaseModel):
    """`POST /v1/audio/speech`: the OpenAI fields, then the Qwen3-TTS extensions."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(min_length=1)]
    input: str
    voice: Annotated[str | None, BeforeValidator(_voice_reference)] = Field(
        None, description='A built-in speaker, or the name or id (also as `{"id": …}`) of one of your saved voices.'
    )
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    response_format: ResponseFormat = "mp3"
    speed: Annotated[float, Field(ge=0.25, le=4.0)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"

    language: str | None = None
    task_type: TaskType | None = None
    ref_audio: str | None = Field(None, description="Base64 or data: URI of an audio file, or an allowed URL.")
    ref_text: str | None = None
    x_vector_only: bool = False
    speaker_embedding: SpeakerEmbedding | None = Field(
        None, description="Voice clone: a precomputed x-vector, base64 of float32 little-endian values."
    )
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    sampling: SamplingParams | None = None
    max_frames: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    ignore_eos: bool = Field(False, description="Benchmarks: every segment runs to `max_frames` whatever its EOS.")

    def check_limits(self, max_input_chars: int) -> None:
        if not self.input.strip():
            raise InvalidParam("input", "must not be empty")
        if len(self.input) > max_input_chars:
            raise InvalidParam("input", f"is {len(self.input)} characters; the limit is {max_input_chars}")
        if self.x_vector_only and self.ref_audio is None and self.speaker_embedding is None:
            raise InvalidParam("x_vector_only", "needs ref_audio")
        if self.ref_text is not None and self.ref_audio is None:
            raise InvalidParam("ref_text", "needs ref_audio")
        if self.ignore_eos and self.max_frames is None:
            raise InvalidParam("ignore_eos", "needs max_frames")


class GenerationRequest(BaseModel):
    """`POST /v1/audio/generations`: text-to-audio (Stable Audio Open)."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(min_length=1)]
    prompt: str
    negative_prompt: str | None = None
    duration_s: Annotated[float, Field(gt=0.0, le=MAX_DIFFUSION_DURATION_S)] = 10.0
    num_steps: Annotated[int, Field(ge=1, le=MAX_DIFFUSION_STEPS)] | None = None
    guidance_scale: Annotated[float, Field(ge=0.0, le=50.0)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    response_format: ResponseFormat = "mp3"
    mode: Literal["sync", "async"] = Field("sync", description="async answers 202 with a request id at once.")

    def check_limits(self, max_input_chars: int) -> None:
        if not self.prompt.strip():
            raise InvalidParam("prompt", "must not be empty")
        if len(self.prompt) > max_input_chars:
            raise InvalidParam("prompt", f"is {len(self.prompt)} characters; the limit is {max_input_chars}")


class CreateVoiceRequest(BaseModel):
    """`POST /v1/audio/voices`: a voice cloned from reference audio, or designed from `instructions` alone."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=MAX_VOICE_NAME_CHARS)]
    audio: str | None = Field(None, description="Base64 or data: URI of an audio file, or an allowed URL.")
    ref_text: str | None = Field(
        None, description="What the reference says: the voice then clones in context (else by speaker embedding)."
    )
    language: str | None = Field(None, description="Default language of speech in this voice.")
    x_vector_only: bool = Field(False, description="The speaker embedding alone (as without `ref_text`).")
    instructions: Annotated[str, Field(min_length=1, max_length=MAX_INSTRUCTIONS_CHARS)] | None = Field(
        None, description="A designed voice: the description that makes it (VoiceDesign checkpoints)."
    )

    def check_fields(self) -> None:
        if self.audio is None and self.instructions is None:
            raise InvalidParam("audio", "is required (or `instructions` alone, for a designed voice)")
        if self.audio is not None and self.instructions is not None:
            raise InvalidParam("instructions", "a voice is made from audio or from instructions, not both")
        if self.audio is None and (self.ref_text is not None or self.x_vector_only):
            raise InvalidParam("ref_text" if self.ref_text is not None else "x_vector_only", "needs audio")
        if self.ref_text is not None and self.x_vector_only:
            raise InvalidParam("ref_text", "is unused with x_vector_only (the speaker embedding alone)")


class VoiceView(BaseModel):
    """A voice: a built-in speaker of the talker, or one of yours (`clone` from audio, `design` from instructions)."""

    id: str
    object: Literal["audio.voice"] = "audio.voice"
    name: str
    kind: Literal["builtin", "clone", "design"]
    model: str = Field(description="The talker model the voice is for; another model refuses it.")
    created_at: int | None = Field(description="Unix seconds; none for built-in speakers.")
    language: str | None = None
    ref_text: str | None = Field(None, description="Clone: the reference's transcript (in-context cloning).")
    ref_duration_s: float | None = Field(None, description="Clone: seconds of reference audio.")
    x_vector_only: bool | None = Field(None, description="Clone: the speaker embedding alone, no in-context reference.")
    instructions: str | None = Field(None, description="Design: the description.")


class VoiceList(BaseModel):
    """`GET /v1/audio/voices`: built-in speakers first, then yours, oldest first; page with `after` = `last_id`.
    `voices`, `task_types` and `languages` describe the loaded talker (as before this list had pages)."""

    object: Literal["list"] = "list"
    data: list[VoiceView]
    first_id: str | None
    last_id: str | None
    has_more: bool
    model: str
    voices: list[str] = Field(description="The built-in speakers' names.")
    task_types: list[str]
    languages: list[str]


class RequestView(BaseModel):
    """`GET /v1/requests/{id}`: a request's status, timings and usage."""

    id: str
    object: Literal["chorus.request"] = "chorus.request"
    kind: str
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    model: str
    voice: str
    created_at: float
    started_at: float | None
    finished_at: float | None
    usage: dict | None
    error: dict | None
    last_sequence: int | None
    progress: dict | None = Field(None, description="Text-to-audio: {step, num_steps} of the diffusion run.")
    timeline: dict | None = Field(
        None,
        description="Milliseconds from admission to each stage of the run, in time order: arrived_ms (when the request "
        "reached the gateway, negative: its wait for admission), admitted_ms (0), started_ms, then text-to-audio's "
        "dispatched_ms (stream to a diffusion replica opened), first_step_ms (its first progress), engine_done_ms "
        "(its Final), encoded_ms, journaled_ms, or speech's first_frame_ms, first_pcm_ms, first_audio_ms (its first "
        "codec frames, PCM and journaled bytes) and, for its next three pieces of audio, frames_N_ms, pcm_N_ms and "
        "journaled_N_ms (N = 1, 2, 3), talker_called_ms (when the gateway opened the talker call), talker_received_ms "
        "and talker_admitted_ms (when the talker took the call in and admitted it, on the talker's clock), and "
        "finished_ms. The service's own timings are in usage.timings "
        "(queue_ms, first_output_ms, total_ms, from its admission there; speech: the talker's, for the first "
        "segment).",
    )

"""Request bodies of the REST API (pydantic), as the OpenAI SDK sends them plus Qwen3-TTS extensions.

Shape errors (missing or unknown fields, wrong JSON types) answer 422; values out of range
answer 400 with `param` naming the field. Limits that operators configure (the `input` length)
are checked by `check_limits` after parsing, since a schema class cannot see the config.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from chorus.gateway.errors import InvalidParam

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
TaskType = Literal["custom_voice", "voice_design", "voice_clone"]
MAX_INSTRUCTIONS_CHARS = 4096
MAX_DIFFUSION_DURATION_S = 47.55  # Stable Audio Open's longest clip
MAX_DIFFUSION_STEPS = 500


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
    voice: str | None = None
    instructions: Annotated[str, Field(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    response_format: ResponseFormat = "mp3"
    speed: Annotated[float, Field(ge=0.25, le=4.0)] = 1.0
    stream_format: Literal["audio", "sse"] = "audio"

    language: str | None = None
    task_type: TaskType | None = None
    ref_audio: str | None = Field(None, description="Base64 or data: URI of an audio file, or an allowed URL.")
    ref_text: str | None = None
    x_vector_only: bool = False
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    sampling: SamplingParams | None = None
    max_frames: Annotated[int, Field(ge=1, le=1 << 20)] | None = None
    ignore_eos: bool = Field(False, description="Benchmarks: every segment runs to `max_frames` whatever its EOS.")

    def check_limits(self, max_input_chars: int) -> None:
        if not self.input.strip():
            raise InvalidParam("input", "must not be empty")
        if len(self.input) > max_input_chars:
            raise InvalidParam("input", f"is {len(self.input)} characters; the limit is {max_input_chars}")
        if self.x_vector_only and self.ref_audio is None:
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

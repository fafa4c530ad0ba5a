"""What a client asks for, how it is checked, and what the engine sends back."""

from __future__ import annotations

import enum
import math
import secrets
import uuid
from dataclasses import dataclass

import numpy as np
import torch

from chorus.runtime.errors import InvalidRequest

MAX_NUM_STEPS = 1000
# T5 reads 128 tokens; far longer text is truncated anyway and only costs tokenizer time.
MAX_PROMPT_CHARS = 4096
MAX_GUIDANCE_SCALE = 50.0
DEFAULT_DURATION_S = 10.0
_MAX_SEED = 2**64 - 1


class SampleFormat(enum.Enum):
    """How an output's samples leave the engine."""

    F32 = "f32"  # float32, as decoded
    S16 = "s16"  # int16, converted on the device as a 16-bit file's encoder converts floats (`to_s16`)


class InvalidGenerationParameter(InvalidRequest):
    """A generation parameter is missing or out of range; `field` names it as in GenerateRequest."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One text-to-audio request as the engine runs it; build it with `validate_request`.

    deadline_s is on the `time.monotonic()` clock; None means no deadline."""

    request_id: str
    prompt: str
    negative_prompt: str | None
    duration_s: float
    start_s: float
    num_steps: int
    guidance_scale: float
    seed: int
    num_outputs: int
    deadline_s: float | None = None
    sample_format: SampleFormat = SampleFormat.F32

    def output_seed(self, index: int) -> int:
        """Output `index` is seeded with seed + index, so output 0 equals a single-output request."""
        return (self.seed + index) % (_MAX_SEED + 1)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The ranges `validate_request` enforces; the duration limit comes from the model's window."""

    max_duration_s: float
    max_num_outputs: int
    default_num_steps: int = 100
    default_guidance_scale: float = 7.0


def validate_request(
    limits: RequestLimits,
    *,
    request_id: str,
    prompt: str,
    negative_prompt: str | None = None,
    duration_s: float = 0.0,
    start_s: float = 0.0,
    num_steps: int = 0,
    guidance_scale: float | None = None,
    seed: int | None = None,
    num_outputs: int = 0,
    deadline_s: float | None = None,
    sample_format: SampleFormat = SampleFormat.F32,
) -> GenerationRequest:
    """Checks user input and fills defaults with the wire contract's meaning of 0 / unset:
    duration 0 → min(10 s, window), num_steps 0 → default, num_outputs 0 → 1, no seed → a random one,
    empty request_id → a random one.
    Raises InvalidGenerationParameter naming the first bad field."""
    if not prompt or not prompt.strip():
        raise InvalidGenerationParameter("prompt", "must not be empty")
    for field_name, text in (("prompt", prompt), ("negative_prompt", negative_prompt or "")):
        if len(text) > MAX_PROMPT_CHARS:
            raise InvalidGenerationParameter(field_name, f"must be at most {MAX_PROMPT_CHARS} characters")
    if duration_s == 0:
        duration_s = min(DEFAULT_DURATION_S, limits.max_duration_s)
    if not (math.isfinite(duration_s) and 0 < duration_s <= limits.max_duration_s):
        raise InvalidGenerationParameter(
            "duration_s", f"must be in (0, {limits.max_duration_s:.2f}] s, got {duration_s}"
        )
    if not (math.isfinite(start_s) and start_s >= 0 and start_s + duration_s <= limits.max_duration_s):
        raise InvalidGenerationParameter(
            "start_s", f"start_s + duration_s must be within [0, {limits.max_duration_s:.2f}] s, got {start_s}"
        )
    num_steps = num_steps or limits.default_num_steps
    if not 1 <= num_steps <= MAX_NUM_STEPS:
        raise InvalidGenerationParameter("num_steps", f"must be in [1, {MAX_NUM_STEPS}], got {num_steps}")
    guidance_scale = limits.default_guidance_scale if guidance_scale is None else guidance_scale
    if not (math.isfinite(guidance_scale) and 0 <= guidance_scale <= MAX_GUIDANCE_SCALE):
        raise InvalidGenerationParameter(
            "guidance_scale", f"must be in [0, {MAX_GUIDANCE_SCALE}], got {guidance_scale}"
        )
    if seed is None:
        seed = secrets.randbits(63)
    if not 0 <= seed <= _MAX_SEED:
        raise InvalidGenerationParameter("seed", f"must be in [0, 2**64 - 1], got {seed}")
    num_outputs = num_outputs or 1
    if not 1 <= num_outputs <= limits.max_num_outputs:
        raise InvalidGenerationParameter("num_outputs", f"must be in [1, {limits.max_num_outputs}], got {num_outputs}")
    return GenerationRequest(
        request_id=request_id or uuid.uuid4().hex,
        prompt=prompt,
        negative_prompt=negative_prompt or None,
        duration_s=float(duration_s),
        start_s=float(start_s),
        num_steps=int(num_steps),
        guidance_scale=float(guidance_scale),
        seed=int(seed),
        num_outputs=int(num_outputs),
        deadline_s=deadline_s,
        sample_format=sample_format,
    )


class FinishReason(enum.Enum):
    COMPLETE = "complete"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class StepProgress:
    """Sent after every denoising step of a request."""

    step: int
    num_steps: int


@dataclass(frozen=True, slots=True)
class AudioOutput:
    """One finished output: waveform (num_audio_channels, num_samples) on the CPU, float32 or (SampleFormat.S16)
    int16."""

    index: int
    waveform: torch.Tensor
    sample_rate_hz: int

    def interleaved_bytes(self) -> bytes:
        """The samples interleaved by channel, little-endian in the waveform's dtype (PcmChunk PCM_F32LE or
        PCM_S16LE). A full 47.55 s stereo window is 16.8 MB in float32: split it across messages to stay under
        message limits."""
        # Copies only once (tobytes) when the waveform's memory is interleaved already, as the runner's is.
        samples = self.waveform.numpy().T
        return np.ascontiguousarray(samples, dtype=samples.dtype.newbyteorder("<")).tobytes()


@dataclass(frozen=True, slots=True)
class Finished:
    """The last event of every request. error_code is a gRPC status name when reason is ERROR."""

    reason: FinishReason
    num_steps_run: int
    audio_s: float
    num_prompt_tokens: int
    queue_ms: float
    first_output_ms: float
    total_ms: float
    error_code: str | None = None
    error_message: str | None = None


Event = StepProgress | AudioOutput | Finished

"""The diffusion engine: request validation, admission, batched sampling. Start with `engine.py`."""

from chorus.diffusion.engine.engine import DiffusionEngine, EngineLoad, StepStats
from chorus.diffusion.engine.request import (
    AudioOutput,
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    InvalidGenerationParameter,
    RequestLimits,
    StepProgress,
    validate_request,
)

__all__ = [
    "AudioOutput",
    "DiffusionEngine",
    "EngineLoad",
    "Event",
    "FinishReason",
    "Finished",
    "GenerationRequest",
    "InvalidGenerationParameter",
    "RequestLimits",
    "StepProgress",
    "StepStats",
    "validate_request",
]

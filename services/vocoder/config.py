"""Vocoder service settings (flags `chorus serve vocoder --help`, env vars CHORUS_VOCODER_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class VocoderConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_VOCODER_"

    model: str = option("tiny", "speech_tokenizer directory, or a preset: tiny (random, CPU-sized).")
    load_format: str = option(
        "auto", "auto: read weights from `model`; dummy: released shapes, random weights.", choices=("auto", "dummy")
    )
    device: str = option("auto", "cuda, cpu, or auto (cuda when available).")
    dtype: str = option("auto", "float32, bfloat16, or auto.")
    max_streams: int = option(128, "Concurrent decode streams (decoder states kept).")

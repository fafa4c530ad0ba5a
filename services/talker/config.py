"""Talker service settings (flags `chorus serve talker --help`, env vars CHORUS_TALKER_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class TalkerConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_TALKER_"

    model: str = option("tiny", "Checkpoint directory, or a preset: tiny (random, CPU-sized).")
    load_format: str = option(
        "auto", "auto: read weights from `model`; dummy: released shapes, random weights.", choices=("auto", "dummy")
    )
    device: str = option("auto", "cuda, cpu, or auto (cuda when available).")
    dtype: str = option("auto", "bfloat16, float16, float32, or auto (bfloat16 on cuda, float32 on cpu).")
    max_streams: int = option(64, "Concurrent synthesis streams (KV-cache slots).")
    chunk_frames: int = option(25, "Codec frames per chunk after the first (one frame = 80 ms).")
    max_frames: int = option(4096, "Default and upper limit of frames per request.")

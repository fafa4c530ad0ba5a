"""Diffusion service settings (flags `chorus serve diffusion --help`, env vars CHORUS_DIFFUSION_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class DiffusionConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_DIFFUSION_"

    model: str = option("tiny", "stable-audio-open-1.0 directory, or a preset: tiny (random, CPU-sized).")
    load_format: str = option(
        "auto", "auto: read weights from `model`; dummy: released shapes, random weights.", choices=("auto", "dummy")
    )
    device: str = option("auto", "cuda, cpu, or auto (cuda when available).")
    dtype: str = option("auto", "float16, bfloat16, float32, or auto (float16 on cuda, float32 on cpu).")
    batch_window_ms: float = option(20.0, "How long the first request of a batch waits for others to join.")
    max_batch_size: int = option(8, "Most requests run in one batch.")

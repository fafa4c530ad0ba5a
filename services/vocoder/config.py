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
    dtype: str = option("auto", "float32, bfloat16, or auto (float32).")
    max_streams: int = option(
        256,
        "Concurrent decode streams (decoder states kept: the talker's 256 on CUDA; ~2.6 MB each at the released size "
        "in bf16).",
    )
    max_batch_size: int = option(64, "Most stream chunks decoded in one batched forward.")
    batch_window_ms: float = option(
        2.0, "How long new work waits so concurrent chunks share one forward (not when no other stream could join)."
    )
    sweep_interval_ms: float = option(
        100.0,
        "Streams with over 0.5 s of audio decoded ahead of their listener wait for a sweep, this often, that decodes "
        "them together (out of step, they would otherwise decode a few at a time); 0: every chunk at once.",
    )
    max_plan_batches: int = option(
        2,
        "Batches decoded back to back before the engine plans again, those of the streams least ahead of their "
        "listeners first (an ending stream's within 0.5 s of audio: its caller waits for the end), so a newcomer's "
        "first chunks do not wait for a whole sweep; also the most rounds of ending streams' next pieces decoded "
        "right after a plan; 0: no limit.",
    )
    idle_timeout_s: float = option(60.0, "A stream nobody sends to or reads from for this long is freed.")
    max_reference_audio_s: float = option(60.0, "Longest reference audio `Encode` accepts.")
    use_cuda_graphs: bool = option(True, "Capture CUDA graphs per (batch, chunk length) bucket on CUDA.")

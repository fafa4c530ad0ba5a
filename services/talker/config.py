"""Talker service settings (flags `chorus serve talker --help`, env vars CHORUS_TALKER_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class TalkerConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_TALKER_"

    model: str = option("tiny", "Checkpoint directory, a released size with --load-format dummy (0.6b, 1.7b), or tiny.")
    load_format: str = option(
        "auto", "auto: read weights from `model`; dummy: released shapes, random weights.", choices=("auto", "dummy")
    )
    device: str = option("auto", "cuda, cpu, or auto (cuda when available).")
    dtype: str = option("auto", "bfloat16, float16, float32, or auto (bfloat16 on cuda, float32 on cpu).")
    max_streams: int = option(
        0, "Concurrent synthesis streams (decode slots); 0: 256 on CUDA (the largest decode batch), 64 elsewhere."
    )
    max_queue: int = option(256, "Requests waiting for a slot (or for text); more get RESOURCE_EXHAUSTED.")
    chunk_frames: int = option(
        25, "Default most codec frames per chunk (one frame = 80 ms); chunks grow 1, 2, 4, … up to it."
    )
    max_frames: int = option(4096, "Default and upper limit of frames per request.")
    max_positions: int = option(4608, "KV-cache positions per stream (prompt + frames): the longest request.")
    kv_cache_positions: int = option(
        0,
        "KV-cache positions all streams share, in blocks of 64. Fewer than max_streams × max_positions serve more "
        "streams in the same memory: when they run out, the newest stream is preempted and resumes later exactly "
        "where it stopped. 0: on CUDA what kv_memory_fraction of the free GPU memory holds (at most max_streams × "
        "max_positions); elsewhere max_streams × max_positions.",
    )
    kv_memory_fraction: float = option(
        0.5,
        "With kv_cache_positions 0 on CUDA: the share of the GPU memory free at start the KV pool takes (the rest is "
        "for graphs and the vocoder and diffusion sharing the GPU; 0.5 of an H100's is ~330k positions at 0.6B).",
    )
    max_prefills_per_step: int = option(
        32,
        "New requests prefilled together in one step (one batched forward, replayed from a graph up to 64): a burst "
        "is admitted in fewer steps; more at once stalls running streams longer.",
    )
    max_buffered_frames: int = option(50, "Frames a stream may hold unread before its request pauses.")
    use_cuda_graphs: bool = option(True, "Capture the decode step as CUDA graphs per batch bucket on CUDA.")
    warmup_positions: int = option(
        1024,
        "Decode graphs for cache lengths up to this are captured before SERVING (bounds start-up); a longer length "
        "is captured when first reached, pausing decoding once (0: up to max_positions). With the compiled step on "
        "CUDA one graph per batch size covers every length.",
    )
    compile_step: bool = option(
        True, "torch.compile the decode step's layers and sampling on CUDA (fewer kernels; ~1 min longer warm-up)."
    )
    few_rows_matmul: bool = option(
        True,
        "With compile_step on CUDA: decode steps at batch 1 and 2 run through chorus's Triton kernels for one or two "
        "rows, each projection with its norm, residual add or SwiGLU fused in, instead of cuBLAS and compiled "
        "element-wise kernels (six launches a layer instead of nine).",
    )
    cache_dir: str = option("~/.cache/chorus", "Where generated files (the tiny checkpoint, tokenizers) are kept.")

    def __post_init__(self) -> None:
        if not 0 < self.kv_memory_fraction <= 1:
            raise ValueError(f"kv_memory_fraction: must be in (0, 1], got {self.kv_memory_fraction}")
        if self.max_streams < 0 or self.kv_cache_positions < 0:
            raise ValueError("max_streams and kv_cache_positions: must be at least 0 (0: sized automatically)")

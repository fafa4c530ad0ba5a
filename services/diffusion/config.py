"""Diffusion service settings (flags `chorus serve diffusion --help`, env vars CHORUS_DIFFUSION_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.diffusion.parallel.plan import PARALLEL_MODES
from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class DiffusionConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_DIFFUSION_"

    model: str = option("tiny", "stable-audio-open-1.0 directory or HF id in the local cache, or a preset: tiny.")
    load_format: str = option(
        "auto", "auto: read weights from `model`; dummy: released shapes, random weights.", choices=("auto", "dummy")
    )
    device: str = option("auto", "cuda, cpu, or auto (cuda when available).")
    dtype: str = option("auto", "DiT dtype: float16, bfloat16, float32, or auto (float16 on cuda, float32 on cpu).")
    # 0: requests that arrive while a batch runs join it at the next step on their own schedule anyway, so a
    # window only aligns their steps; it buys no throughput and costs a lone request the whole window.
    batch_window_ms: float = option(
        0.0, "How long the first request of an idle engine waits for others to join (0: it starts at once)."
    )
    max_batch_size: int = option(8, "Most samples stepped together (each runs CFG in the same forward).")
    max_queue_size: int = option(
        64, "Requests waiting beyond the running batch; more are refused (RESOURCE_EXHAUSTED)."
    )
    default_num_steps: int = option(100, "Steps when a request names none.")
    default_guidance_scale: float = option(7.0, "Classifier-free guidance when a request names none.")
    use_cuda_graphs: bool = option(
        True, "Capture the DiT as CUDA graphs per batch size on CUDA (with parallel: cfg only; tp and sp run eagerly)."
    )
    compile_dit: bool = option(
        True,
        "torch.compile the DiT blocks where CUDA graphs are captured (~35 s more start-up; on an H100 8 concurrent "
        "requests took 8.1 s through the gateway with it and cuDNN attention, 10.5 s without).",
    )
    compile_mode: str = option(
        "default",
        "Inductor mode with compile_dit; max-autotune-no-cudagraphs tunes GEMMs per shape (minutes of start-up).",
        choices=("default", "max-autotune-no-cudagraphs"),  # chorus.diffusion.dit.COMPILE_MODES
    )
    attention_backend: str = option(
        "cudnn",
        "SDPA kernel order: cudnn (cuDNN first, then flash, efficient, math), flash, or auto (PyTorch's choice).",
        choices=("auto", "cudnn", "flash"),
    )
    parallel: str = option(
        "none",
        "Run one model over several GPUs of this host: cfg (CFG halves on different ranks), tp (tensor "
        "parallel DiT), sp (Ulysses sequence parallel), cfg+tp or cfg+sp (two CFG groups, each tp or sp).",
        choices=PARALLEL_MODES,
    )
    parallel_degree: int = option(
        2,
        "Processes (one GPU each) with parallel; cfg+tp and cfg+sp use 2 CFG groups of degree/2. The tp and sp "
        "degree must divide the DiT's attention heads (24) and KV heads (12).",
    )

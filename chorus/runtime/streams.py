"""A CUDA stream of its own for an engine's worker thread.

Work on PyTorch's default (legacy) stream serialises with every other stream of the process. An engine that
shares its process — and its GPU — with another (`chorus serve speech`) runs on a non-blocking stream of its
own, so the two engines' kernels interleave on the GPU, the higher-priority one first.
"""

from __future__ import annotations

import torch


def use_own_stream(device: torch.device, priority: int | None) -> None:
    """Make a new stream the calling thread's current stream on `device` (no-op off CUDA or when `priority`
    is None). Lower numbers are higher priorities; CUDA clamps to its range (0 down to -5 on recent GPUs)."""
    if priority is None or device.type != "cuda":
        return
    torch.cuda.set_device(device)
    torch.cuda.set_stream(torch.cuda.Stream(device, priority=priority))

"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's Triton kernels.

A decode step at batch 1 is a chain of ~800 short kernels (bench/results/kernels-20261126-150936: 789 a step on an
H100), each of which reads the one before's output. Launched one after the other, each waits for the previous one
to end before it even starts. Launched with PDL (`launch_pdl=True`), a kernel starts once every program of the one
before it has called `let_next_kernel_start`: it reads what does not depend on that kernel (its weights), then
blocks in `wait_for_previous_kernel` until the previous kernel's output is complete and visible.

Every program of a kernel launched with PDL waits before it reads an earlier kernel's output or writes anything: a
kernel that completes has then waited for the one before, so completion still orders the whole chain. A kernel
lets the next one start late, once it has read its own weights: let at their start, the next kernels' programs
filled the GPU and spun while the current one still streamed its weights, and a step at batch 1 took 4.08 ms
instead of 3.71 (0.6B, H100, 63df149 against 3e2b7e7 in one call). Let start after their reads, a step took
3.70–3.71 ms against 3.90 without PDL, and 4.07 against 4.23 at batch 2 (one call on one H100, bench/results/
talker-20261126-152318 and -152503 against -152433). CUDA graphs keep the launches' PDL edges. Triton's interpreter
has no PDL: `enabled` is False there.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def enabled(tensor: torch.Tensor) -> bool:
    """Whether kernels reading `tensor` launch with PDL: on CUDA devices that have it (compute capability ≥ 9)."""
    return tensor.is_cuda and _has_pdl(tensor.device.index)


@functools.cache
def _has_pdl(device_index: int | None) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    if PDL:
        gdc_wait()


@triton.jit
def let_next_kernel_start(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()

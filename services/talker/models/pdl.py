"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's Triton kernels.

A decode step at batch 1 is a chain of ~800 short kernels (bench/results/kernels-20261126-150936: 789 a step on an
H100), each of which reads the one before's output. Launched one after the other, every kernel's start-up and tail
leave the GPU partly idle. Launched with PDL (`launch_pdl=True`), a kernel starts while the one before it is still
running: it first reads what does not depend on that kernel (its weights), then calls `wait_for_previous_kernel`,
which lets the next kernel start in turn and blocks until the previous kernel's output is complete and visible.

Every program of a kernel launched with PDL calls it, before it reads an earlier kernel's output or writes anything:
a kernel that completes has then waited for the one before, so completion still orders the whole chain. CUDA graphs
keep the launches' PDL edges. Triton's interpreter has no PDL: `enabled` is False there.
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
        gdc_launch_dependents()
        gdc_wait()

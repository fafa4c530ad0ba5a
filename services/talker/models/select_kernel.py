"""The k-th largest score of each row in one Triton launch, for `sampling.warp`'s top-k selection on CUDA.

Why: top-k sampling needs only the k-th largest score of a row (k ≤ 64), yet `torch.topk` finds it with a
multi-pass radix select (`gatherTopK`, ~20 µs a call on an H200) and then sorts its 64 results (~5 µs); at 16 calls
a frame that is ~0.4 ms of a ~4.6 ms decode step at batch 1.

How: one program per row holds the whole row in registers (`BLOCK`, the next power of two ≥ V, masked) and maps
each float32 to a uint32 key that orders like the float: positive floats set the sign bit, negative ones flip every
bit, so -inf is 0x007FFFFF and padding (key 0) lies below every float. A bitwise binary search from the top bit
down then finds the largest key t with count(key ≥ t) ≥ k — one reduction over the row per bit, 32 in all — which
is exactly the k-th largest key, ties counted with multiplicity as `topk(...).values[k - 1]` counts them. The
float comes back from the key bit for bit (-inf where fewer than k scores are finite, as with topk). The one
difference from topk: -0.0 orders below +0.0, which compare equal as floats, so `warped < kth` keeps the same ids.

`kth_largest` is a `torch.library.custom_op` with a fake implementation, so `torch.compile(fullgraph=True,
dynamic=True)` keeps it as one opaque call (the row length stays a runtime value: `BLOCK` is picked per call) and
CUDA graphs capture its single launch; it neither syncs with the host nor allocates beyond its `[B]` output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.talker.models import pdl
from chorus.talker.models.pdl import wait_for_previous_kernel


@triton.jit
def _kth_largest_kernel(scores_ptr, k_ptr, out_ptr, stride_row, num_cols, BLOCK: tl.constexpr, PDL: tl.constexpr):
    wait_for_previous_kernel(PDL)  # launched while the kernel writing the scores ends: see `pdl`
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    in_row = cols < num_cols
    bits = tl.load(scores_ptr + row * stride_row + cols, mask=in_row, other=0.0).to(tl.uint32, bitcast=True)
    sign = tl.full((), 0x80000000, tl.uint32)
    keys = tl.where((bits & sign) != 0, ~bits, bits | sign)
    keys = tl.where(in_row, keys, tl.zeros_like(keys))
    k = tl.load(k_ptr + row)
    threshold = tl.zeros((), tl.uint32)
    for shift in tl.static_range(31, -1, -1):
        candidate = threshold | (tl.full((), 1, tl.uint32) << shift)
        count = tl.sum((keys >= candidate).to(tl.int32), axis=0)
        threshold = tl.where(count >= k, candidate, threshold)
    kth_bits = tl.where((threshold & sign) != 0, threshold & ~sign, ~threshold)
    tl.store(out_ptr + row, kth_bits.to(tl.float32, bitcast=True))


@torch.library.custom_op("chorus::kth_largest", mutates_args=())
def kth_largest(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The `k[b]`-th largest value `[B]` (float32) of each row of `scores [B, V]` (float32); `k [B]` (int64) in
    [1, V]."""
    assert scores.dtype == torch.float32 and scores.dim() == 2 and k.dtype == torch.int64
    scores = scores if scores.stride(-1) == 1 else scores.contiguous()
    batch, num_cols = scores.shape
    out = scores.new_empty(batch)
    if batch:
        block = triton.next_power_of_2(num_cols)  # 8 warps: 8 or 16 keys a thread at V = 2048 / 3072 (untuned)
        uses_pdl = pdl.enabled(scores)
        _kth_largest_kernel[(batch,)](
            scores, k.contiguous(), out, scores.stride(0), num_cols, BLOCK=block, PDL=uses_pdl, num_warps=8,
            launch_pdl=uses_pdl,
        )  # fmt: skip
    return out


@kth_largest.register_fake
def _(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return scores.new_empty(scores.shape[0])

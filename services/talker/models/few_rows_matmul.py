"""`x @ weightᵀ` for one or two rows of `x`, the decode step's projections at batch 1 and 2 on CUDA.

Why: at batch 1 a decode step's ~430 projections are bound by reading their weights, yet cuBLAS's kernels for one
row (`nvjet_sm90_tst_64x8_…`, and for the MLP's down projection split-K plus a reduce kernel) took 2.6 of the step's
3.9 ms of GPU time on an H100 (bench/results/kernels-20261126-104549).

How: one program per BLOCK_N output columns streams those columns' weight rows once along K and multiplies them
with every input row at once (the rows are few, so the products stay in registers), accumulating in fp32 and
rounding once to the activation dtype, as cuBLAS does; only the order of the additions differs. A small BLOCK_N
gives enough programs to fill the GPU without splitting K.

Measured on an H100 at the 0.6B decode shapes (QKV 4096×1024, output 1024×2048, gate-up 6144×1024, down 1024×3072,
heads 3072×1024 and 2048×1024), GPU time from a cold L2 cache: at one row the kernel took 7.3–10.5 µs where cuBLAS
took 8.4–11.1 µs, faster on every shape; at two rows it ranged from 2 % slower to 11 % faster; at four rows cuBLAS
was 3–35 % faster, so MAX_ROWS is 2. Per-shape tuning picked BLOCK_N 4 and BLOCK_K 1024 with 4 warps for most
shapes. The whole talker step at batch 1 went from 4.30 to 3.90–3.93 ms (bench/results/talker-20261126-133902
against -134149, tuned per shape). The block sizes are fixed rather than tuned at start-up on purpose: they set the
order of the additions, and replicas that tuned differently would round differently, so a stream resumed on
another replica would not continue with the same numbers.

`few_rows_matmul` is a `torch.library.custom_op` with a fake implementation, so compiled code keeps it as one call
and CUDA graphs capture its single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 2
BLOCK_N = 4
MAX_BLOCK_K = 1024
NUM_WARPS = 4


@triton.jit
def _few_rows_matmul_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    num_rows,
    num_cols,
    depth,
    stride_x_row,
    stride_weight_col,
    stride_out_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < num_rows, cols < num_cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, depth, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        weight = tl.load(
            weight_ptr + cols[:, None] * stride_weight_col + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x = tl.load(x_ptr + rows[:, None] * stride_x_row + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * weight.to(tl.float32)[None, :, :], axis=2)
    out = out_ptr + rows[:, None] * stride_out_row + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@torch.library.custom_op("chorus::few_rows_matmul", mutates_args=())
def few_rows_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x [M, K] @ weight [N, K]ᵀ` → `[M, N]` in x's dtype, for 1 ≤ M ≤ MAX_ROWS."""
    num_rows, depth = x.shape
    num_cols = weight.shape[0]
    assert 1 <= num_rows <= MAX_ROWS and weight.shape[1] == depth and x.dtype == weight.dtype
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    out = x.new_empty(num_rows, num_cols)
    _few_rows_matmul_kernel[(triton.cdiv(num_cols, BLOCK_N),)](
        x,
        weight,
        out,
        num_rows,
        num_cols,
        depth,
        x.stride(0),
        weight.stride(0),
        out.stride(0),
        BLOCK_M=triton.next_power_of_2(num_rows),
        BLOCK_N=BLOCK_N,
        BLOCK_K=min(MAX_BLOCK_K, triton.next_power_of_2(depth)),
        num_warps=NUM_WARPS,
    )
    return out


@few_rows_matmul.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


class FewRowsLinear(torch.nn.Module):
    """A bias-free `nn.Linear` whose forward takes `few_rows_matmul` for at most MAX_ROWS rows on CUDA and
    `F.linear` otherwise (prefills, larger batches, the CPU). Shares the weight of the Linear it replaces."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        assert linear.bias is None
        self.weight = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.numel() // self.in_features
        if x.is_cuda and num_rows <= MAX_ROWS:
            return few_rows_matmul(x.reshape(num_rows, self.in_features), self.weight).view(*x.shape[:-1], -1)
        return torch.nn.functional.linear(x, self.weight)

"""`x @ weightᵀ` for one or two rows of `x`, with the decode step's element-wise work fused in: the decode step's
projections at batch 1 and 2 on CUDA.

Why: at batch 1 a decode step's ~430 projections are bound by reading their weights, yet cuBLAS's kernels for one
row (`nvjet_sm90_tst_64x8_…`, and for the MLP's down projection split-K plus a reduce kernel) took 2.6 of the step's
3.9 ms of GPU time on an H100 (bench/results/kernels-20261126-104549). Around them, each layer launched three more
kernels for its residual adds, RMS norms and SwiGLU: ~0.7 ms a step at ~2 µs a launch, for almost no work.

How: one program per BLOCK_N output columns streams those columns' weight rows once along K and multiplies them
with every input row at once (the rows are few, so the products stay in registers), accumulating in fp32 and
rounding once to the activation dtype, as cuBLAS does; only the order of the additions differs. A small BLOCK_N
gives enough programs to fill the GPU without splitting K. The element-wise work rides along:

- `norm_weight`: the input rows are RMS-normalised first (a prologue). Every program computes the rows' RMS itself:
  a row is a few KB, read from L2, against the tens of KB of weights it streams.
- `swiglu`: the weight is gate rows then up rows (`Qwen3MLP.gate_up_proj`); a program streams both halves' rows of
  its columns and returns `silu(gate) · up`, half the weight's rows wide.
- `residual`: added to the product (an epilogue).

Each rounds to the activation dtype where the reference PyTorch layer rounds (the normalised rows before their
scale, the projection before the residual add or the SwiGLU, silu's output before the product), so fusing changes
nothing but the order of fp32 additions.

Measured on an H100 at the 0.6B decode shapes (QKV 4096×1024, output 1024×2048, gate-up 6144×1024, down 1024×3072,
heads 3072×1024 and 2048×1024), GPU time from a cold L2 cache, the product alone: at one row the kernel took
7.3–10.5 µs where cuBLAS took 8.4–11.1 µs, faster on every shape; at two rows it ranged from 2 % slower to 11 %
faster; at four rows cuBLAS was 3–35 % faster, so MAX_ROWS is 2. The block sizes are fixed rather than tuned at
start-up on purpose: they set the order of the additions, and replicas that tuned differently would round
differently, so a stream resumed on another replica would not continue with the same numbers.

With the element-wise work fused in, a step at batch 1 took 3.73 ms where the product alone took 3.89 and cuBLAS
4.29; at batch 2 3.99, 4.20 and 4.38 (0.6B on one H100, one call: bench/results/talker-20261126-150716, -150836,
-150749). The kernels also launch with PDL: see `pdl`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.talker.models import pdl
from chorus.talker.models.pdl import let_next_kernel_start, wait_for_previous_kernel

MAX_ROWS = 2
BLOCK_N = 4
MAX_BLOCK_K = 1024
NUM_WARPS = 4


@triton.jit
def _few_rows_matmul_kernel(
    x_ptr,
    weight_ptr,
    norm_weight_ptr,
    residual_ptr,
    out_ptr,
    num_rows,
    num_cols,
    depth,
    eps,
    stride_x_row,
    stride_weight_col,
    stride_residual_row,
    stride_out_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    SWIGLU: tl.constexpr,
    RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,
):
    dtype = out_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < num_rows, cols < num_cols
    x_rows = x_ptr + rows[:, None] * stride_x_row
    weight_rows = weight_ptr + cols[:, None] * stride_weight_col
    # The first block of weights is read before waiting for the kernel before: see `pdl`.
    weight, up = _weights(weight_rows, num_cols * stride_weight_col, tl.arange(0, BLOCK_K), col_ok, depth, SWIGLU)
    wait_for_previous_kernel(PDL)
    if NORM:  # each row's 1 / RMS over the whole depth, in fp32
        squares = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for start in range(0, depth, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & (ks < depth)[None, :], other=0.0).to(tl.float32)
            squares += tl.sum(x * x, axis=1)
        inv_rms = tl.rsqrt(squares / depth + eps)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, depth, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        if NORM:  # normalised, rounded, then scaled and rounded again: `qwen3_layers.rms_norm`
            scale = tl.load(norm_weight_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = ((x * inv_rms[:, None]).to(dtype).to(tl.float32) * scale[None, :]).to(dtype).to(tl.float32)
        acc += tl.sum(x[:, None, :] * weight[None, :, :], axis=2)
        if SWIGLU:
            up_acc += tl.sum(x[:, None, :] * up[None, :, :], axis=2)
        weight, up = _weights(weight_rows, num_cols * stride_weight_col, ks + BLOCK_K, col_ok, depth, SWIGLU)
    let_next_kernel_start(PDL)  # the weights are read: the next kernel's reads no longer compete with ours
    out = acc.to(dtype).to(tl.float32)
    if SWIGLU:
        silu = (out * tl.sigmoid(out)).to(dtype).to(tl.float32)
        out = (silu * up_acc.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    out_mask = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        residual = tl.load(residual_ptr + rows[:, None] * stride_residual_row + cols[None, :], mask=out_mask)
        out = out + residual.to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_out_row + cols[None, :], out.to(dtype), mask=out_mask)


@triton.jit
def _weights(weight_rows, up_offset, ks, col_ok, depth, SWIGLU: tl.constexpr):
    """The block `ks` of the program's weight rows in fp32 (zeros past `depth`: a block past the last reads
    nothing), and with SWIGLU the up projection's rows of the same columns, `up_offset` further."""
    mask = col_ok[:, None] & (ks < depth)[None, :]
    weight = tl.load(weight_rows + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    up = weight
    if SWIGLU:
        up = tl.load(weight_rows + up_offset + ks[None, :], mask=mask, other=0.0).to(tl.float32)
    return weight, up


def few_rows_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    swiglu: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """`x [M, K] @ weight [N, K]ᵀ` → `[M, N]` in x's dtype, for 1 ≤ M ≤ MAX_ROWS; `rms_norm(x, norm_weight, eps)`
    in place of `x` if `norm_weight` is given; `silu(gate) · up` → `[M, N / 2]` if `swiglu` (the weight's first
    half of rows are the gate's, the second the up projection's); plus `residual [M, N]` if given."""
    num_rows, depth = x.shape
    num_cols = weight.shape[0] // 2 if swiglu else weight.shape[0]
    assert 1 <= num_rows <= MAX_ROWS and weight.shape[1] == depth and x.dtype == weight.dtype
    assert norm_weight is None or norm_weight.shape == (depth,)
    assert residual is None or (residual.shape == (num_rows, num_cols) and residual.stride(-1) == 1)
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    out = x.new_empty(num_rows, num_cols)
    launch(x, weight, out, norm_weight, eps, swiglu, residual, BLOCK_N, MAX_BLOCK_K, NUM_WARPS, pdl.enabled(x))
    return out


def launch(x, weight, out, norm_weight, eps, swiglu, residual, block_n, max_block_k, num_warps, uses_pdl) -> None:
    """The kernel into `out` with these block sizes (`few_rows_matmul`'s checks and layout already done); what
    `bench/few_rows_matmul_sweep.py` times other block sizes with."""
    num_rows, depth = x.shape
    num_cols = out.shape[1]
    _few_rows_matmul_kernel[(triton.cdiv(num_cols, block_n),)](
        x,
        weight,
        norm_weight,
        residual,
        out,
        num_rows,
        num_cols,
        depth,
        eps,
        x.stride(0),
        weight.stride(0),
        0 if residual is None else residual.stride(0),
        out.stride(0),
        BLOCK_M=triton.next_power_of_2(num_rows),
        BLOCK_N=block_n,
        BLOCK_K=min(max_block_k, triton.next_power_of_2(depth)),
        NORM=norm_weight is not None,
        SWIGLU=swiglu,
        RESIDUAL=residual is not None,
        PDL=uses_pdl,
        num_warps=num_warps,
        launch_pdl=uses_pdl,
    )

"""`x @ weightᵀ` for up to `MAX_ROWS` rows on tensor cores, with the decode step's element-wise work fused in: the
decode step's projections past `few_rows_matmul`'s two rows, on CUDA.

Why: at batch 64 a 0.6B decode step spent 2.76 of its 4.7 ms of GPU time in cuBLAS's projections (~28 µs a layer
for 9.4 µs of weight reads at full HBM bandwidth, plus a split-K reduce), and each layer launched three more
kernels for its residual adds, RMS norms and SwiGLU (bench/results/kernels-20261126-183902).

How: `few_rows_matmul`'s fusions — the RMS norm as a prologue, SwiGLU and the residual add as epilogues, each
rounding where the PyTorch layer rounds — around a tiled product: one program per (BLOCK_M rows, BLOCK_N columns)
streams its columns' weight rows along K and multiplies them with the rows' block on tensor cores (`tl.dot`),
accumulating in fp32 and rounding once to the activation dtype. The block sizes are fixed, not tuned at start-up,
so every replica adds in the same order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.talker.models import pdl
from chorus.talker.models.pdl import let_next_kernel_start, wait_for_previous_kernel

MAX_ROWS = 64
BLOCK_N = 32
BLOCK_K = 128
NUM_WARPS = 4
NUM_STAGES = 3
_DOT_PRECISION = {torch.bfloat16: "tf32", torch.float16: "tf32", torch.float32: "ieee"}


@triton.jit
def _tile_matmul_kernel(
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
    DOT_PRECISION: tl.constexpr,
):
    dtype = out_ptr.dtype.element_ty
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < num_rows, cols < num_cols
    x_rows = x_ptr + rows[:, None] * stride_x_row
    weight_rows = weight_ptr + cols[:, None] * stride_weight_col
    up_rows = weight_rows + num_cols * stride_weight_col  # with SWIGLU: the up projection's rows of our columns
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
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if NORM:  # normalised, rounded, then scaled and rounded again: `qwen3_layers.rms_norm`
            scale = tl.load(norm_weight_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = ((x.to(tl.float32) * inv_rms[:, None]).to(dtype).to(tl.float32) * scale[None, :]).to(dtype)
        weight_mask = col_ok[:, None] & k_ok[None, :]
        weight = tl.load(weight_rows + ks[None, :], mask=weight_mask, other=0.0)
        acc = tl.dot(x, tl.trans(weight), acc, input_precision=DOT_PRECISION)
        if SWIGLU:
            up = tl.load(up_rows + ks[None, :], mask=weight_mask, other=0.0)
            up_acc = tl.dot(x, tl.trans(up), up_acc, input_precision=DOT_PRECISION)
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


def tile_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    swiglu: bool = False,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """`few_rows_matmul`'s contract for 1 ≤ M ≤ MAX_ROWS rows: `x [M, K] @ weight [N, K]ᵀ` → `[M, N]` in x's dtype,
    `rms_norm(x, norm_weight, eps)` in place of `x` if `norm_weight` is given, `silu(gate) · up` → `[M, N / 2]` if
    `swiglu`, plus `residual [M, N]` if given."""
    num_rows, depth = x.shape
    num_cols = weight.shape[0] // 2 if swiglu else weight.shape[0]
    assert 1 <= num_rows <= MAX_ROWS and weight.shape[1] == depth and x.dtype == weight.dtype
    assert norm_weight is None or norm_weight.shape == (depth,)
    assert residual is None or (residual.shape == (num_rows, num_cols) and residual.stride(-1) == 1)
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    out = x.new_empty(num_rows, num_cols)
    launch(x, weight, out, norm_weight, eps, swiglu, residual, BLOCK_N, BLOCK_K, NUM_WARPS, NUM_STAGES, pdl.enabled(x))
    return out


def launch(x, weight, out, norm_weight, eps, swiglu, residual, block_n, block_k, num_warps, num_stages, uses_pdl):
    """The kernel into `out` with these block sizes (`tile_matmul`'s checks and layout already done); what
    `bench/tile_matmul_sweep.py` times other block sizes with."""
    num_rows, depth = x.shape
    num_cols = out.shape[1]
    block_m = max(16, triton.next_power_of_2(num_rows))  # tensor-core tiles are at least 16 rows
    _tile_matmul_kernel[(triton.cdiv(num_cols, block_n), triton.cdiv(num_rows, block_m))](
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
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NORM=norm_weight is not None,
        SWIGLU=swiglu,
        RESIDUAL=residual is not None,
        PDL=uses_pdl,
        DOT_PRECISION=_DOT_PRECISION[x.dtype],
        num_warps=num_warps,
        num_stages=num_stages,
        launch_pdl=uses_pdl,
    )

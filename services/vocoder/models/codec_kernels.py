"""The codec decoder's elementwise glue on CUDA as Triton kernels: each activation read once and written once.

The decoder's last stages are large (96 channels × 24,000 samples per second of audio, per stream), so every extra
pass over an activation costs. Eager SnakeBeta was five such passes; it is one kernel here (an H100 profile had the
eager chain at over half of a 110 ms decode). After that, an H200 profile of one chunk batch (bf16, released
shapes, 64 streams × 25 frames, CUDA-graph replay: 68 ms) still spent 15.2 ms in 56 broadcast `add` kernels —
ATen adds each conv's bias as a pass of its own after cuDNN's convolution, plus the residual adds — and 11.9 ms in
21 `torch.cat` copies that prepend each causal conv's left context; the snake kernel itself took 6.4 ms, the
convolutions about 12 ms. So these kernels also add the bias of the conv that produced their input (the convs run
without theirs), read and write any strides, and so write a snake straight into the chunk columns of the next
conv's padded input (no cat) and read a transposed conv's output slice in place (no `.contiguous()` copy).

Every kernel computes in fp32 registers and rounds once to the output dtype. In bf16 the fused path differs from
the eager chain only by that chain's intermediate roundings: a bias is added in fp32 to the conv's output and
rounded with the kernel's result, where eager rounds `conv + bias` first, and a residual sum
`(hidden + bias) + (update + bias)` is rounded once, where eager rounds each sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _load_row(ptr, bias_ptr, batch, channel, offsets, mask, stride_b, stride_c, stride_t, HAS_BIAS: tl.constexpr):
    """One block of row (batch, channel) of a [B, C, T] tensor of any strides, in fp32, plus the channel's bias."""
    start = batch.to(tl.int64) * stride_b + channel.to(tl.int64) * stride_c
    row = tl.load(ptr + start + offsets.to(tl.int64) * stride_t, mask=mask).to(tl.float32)
    if HAS_BIAS:
        row += tl.load(bias_ptr + channel).to(tl.float32)
    return row


@triton.jit
def _store_row(ptr, values, batch, channel, offsets, mask, stride_b, stride_c, stride_t):
    start = batch.to(tl.int64) * stride_b + channel.to(tl.int64) * stride_c
    tl.store(ptr + start + offsets.to(tl.int64) * stride_t, values.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _snake_kernel(
    x_ptr,
    bias_ptr,
    alpha_ptr,
    inv_beta_ptr,
    out_ptr,
    num_channels,
    num_samples,
    x_stride_b,
    x_stride_c,
    x_stride_t,
    out_stride_b,
    out_stride_c,
    out_stride_t,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)  # one (batch, channel) row
    batch, channel = row // num_channels, row % num_channels
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offsets < num_samples
    x = _load_row(x_ptr, bias_ptr, batch, channel, offsets, in_row, x_stride_b, x_stride_c, x_stride_t, HAS_BIAS)
    wave = tl.sin(x * tl.load(alpha_ptr + channel))
    snake = x + tl.load(inv_beta_ptr + channel) * wave * wave
    _store_row(out_ptr, snake, batch, channel, offsets, in_row, out_stride_b, out_stride_c, out_stride_t)


@triton.jit
def _residual_kernel(
    x_ptr,
    x_bias_ptr,
    y_ptr,
    y_bias_ptr,
    out_ptr,
    num_channels,
    num_samples,
    x_stride_b,
    x_stride_c,
    x_stride_t,
    y_stride_b,
    y_stride_c,
    y_stride_t,
    HAS_X_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)  # one (batch, channel) row; `out` is contiguous
    batch, channel = row // num_channels, row % num_channels
    offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_row = offsets < num_samples
    x = _load_row(x_ptr, x_bias_ptr, batch, channel, offsets, in_row, x_stride_b, x_stride_c, x_stride_t, HAS_X_BIAS)
    y = _load_row(y_ptr, y_bias_ptr, batch, channel, offsets, in_row, y_stride_b, y_stride_c, y_stride_t, True)
    _store_row(out_ptr, x + y, batch, channel, offsets, in_row, num_channels * num_samples, num_samples, 1)


def _grid(hidden: torch.Tensor) -> tuple[int, int]:
    batch, channels, samples = hidden.shape
    return batch * channels, triton.cdiv(samples, _BLOCK)


def snake(
    hidden: torch.Tensor,
    log_alpha: torch.Tensor,
    log_beta: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """SnakeBeta of `hidden + bias`: x + sin²(x·e^α) / (e^β + 1e-9) per channel.

    Args:
        hidden: [B, C, T], any strides (a sliced transposed-conv output, say).
        log_alpha, log_beta: [C], the checkpoint's parameters.
        bias: [C] or None, the bias of the conv that produced `hidden` and ran without it.
        out: [B, C, T] to write into, any strides (the chunk part of a conv's padded input, say), or None for a
            new contiguous tensor.

    Returns:
        `out`.
    """
    out = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if out is None else out
    assert out.shape == hidden.shape, (out.shape, hidden.shape)
    alpha = log_alpha.float().exp()
    inv_beta = 1.0 / (log_beta.float().exp() + 1e-9)
    _snake_kernel[_grid(hidden)](
        hidden,
        hidden if bias is None else bias,
        alpha,
        inv_beta,
        out,
        hidden.shape[1],
        hidden.shape[2],
        *hidden.stride(),
        *out.stride(),
        HAS_BIAS=bias is not None,
        BLOCK=_BLOCK,
    )
    return out


def add_residual(
    hidden: torch.Tensor, hidden_bias: torch.Tensor | None, update: torch.Tensor, update_bias: torch.Tensor
) -> torch.Tensor:
    """(hidden + hidden_bias) + (update + update_bias), biases [C] per channel, as a new contiguous [B, C, T].

    `hidden` and `update` may have any strides; `hidden_bias` None adds nothing to `hidden`."""
    assert hidden.shape == update.shape, (hidden.shape, update.shape)
    out = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    _residual_kernel[_grid(hidden)](
        hidden,
        hidden if hidden_bias is None else hidden_bias,
        update,
        update_bias,
        out,
        hidden.shape[1],
        hidden.shape[2],
        *hidden.stride(),
        *update.stride(),
        HAS_X_BIAS=hidden_bias is not None,
        BLOCK=_BLOCK,
    )
    return out

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

The next profile (42 ms) spent 9.2 ms in cuDNN's NCHW ↔ NHWC conversions around its bf16 convolutions, which run
NHWC. So the fused path keeps its activations channels-last ((B, C, T) with (B, T, C) memory), each new buffer in
the layout of its input (`new_activation`), and the kernels work on [samples × channels] tiles whose memory is
contiguous along whichever axis has stride 1, so either layout is read and written coalesced.

Every kernel computes in fp32 registers and rounds once to the output dtype. For a 16-bit output the snake takes its
sine from the GPU's special-function unit instead of libdevice's exact `sinf`, whose ~40 instructions made the kernel
compute-bound: 0.48 ms against 0.34 for 64 streams × 96 channels × 48,000 samples in bf16 on an H200, where a plain copy
of the same tensor takes 0.28 (`bench/snake_sine_probe.py`, bench/results/snake-sine-a81211a.json). sin² has period π,
so the argument is first reduced to [−π/2, π/2], where the unit's error is ~2⁻²¹: 0.007–0.009 % of the bf16 outputs
round differently from the exact sine's, by one unit in the last place. fp32 outputs keep the exact sine. In bf16 the
fused path differs from the eager chain only by that chain's intermediate roundings: a bias is added in fp32 to the
conv's output and rounded with the kernel's result, where eager rounds `conv + bias` first, and a residual sum
`(hidden + bias) + (update + bias)` is rounded once, where eager rounds each sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

# A program's tile: 2048 elements of one batch row, 32 channels × 64 samples where there are 32 channels or more (the
# released counts, 1024 and 96 · 2^k, are multiples of 32: a tile row is 64 contiguous bf16 bytes channels-last, 128
# contiguous), fewer channels × more samples below.
_TILE_SIZE = 2048
_MAX_BLOCK_CHANNELS = 32


def is_channels_last(hidden: torch.Tensor) -> bool:
    """Whether a [B, C, T] tensor keeps each sample's channels together in memory, as a transposed (B, T, C) does
    (one sample is either layout: it counts as channels-last, as cuDNN's output for it may have any strides)."""
    return hidden.stride(1) < hidden.stride(2) or hidden.shape[2] == 1


def new_activation(like: torch.Tensor, num_samples: int | None = None) -> torch.Tensor:
    """An uninitialised [B, C, num_samples] (default: like's T) in the layout of `like`: channels-last (strides
    (T·C, 1, C)) if `like` is, else contiguous. The fused path allocates every activation so, which keeps a
    channels-last decode channels-last from conv to conv."""
    batch, channels, samples = like.shape
    samples = samples if num_samples is None else num_samples
    if is_channels_last(like):
        return like.new_empty(batch, samples, channels).transpose(1, 2)
    return like.new_empty(batch, channels, samples)


@triton.jit
def _tile_pointers(ptr, batch, channels, samples, stride_b, stride_c, stride_t):
    """[BLOCK_SAMPLES, BLOCK_CHANNELS] pointers into batch row `batch` of a [B, C, T] tensor of any strides. Triton
    compiles a stride of 1 in as a constant and lays the tile out along that axis, so loads and stores are coalesced
    whether samples (contiguous) or channels (channels-last) are adjacent in memory."""
    row = ptr + batch.to(tl.int64) * stride_b
    return row + samples.to(tl.int64)[:, None] * stride_t + channels.to(tl.int64)[None, :] * stride_c


@triton.jit
def _per_channel(ptr, channels, in_channels):
    """A [C] vector's entries for the tile's channels, as a [1, BLOCK_CHANNELS] row in fp32."""
    return tl.load(ptr + channels, mask=in_channels).to(tl.float32)[None, :]


@triton.jit
def _sin_squared(y, FAST: tl.constexpr):
    """sin²(y); FAST: from the special-function unit, after reducing y by its period π (see the module's notes)."""
    if FAST:
        turns = libdevice.rint(y * 0.3183098861837907)  # 1/π
        # π in two parts, the first of 8 bits, so `turns · 3.140625` is exact for |y| up to ~10⁵.
        reduced = y - turns * 3.140625 - turns * 9.676535897932795e-4
        wave = libdevice.fast_sinf(reduced)
    else:
        wave = tl.sin(y)
    return wave * wave


@triton.jit
def _snake_kernel(
    x_ptr,
    bias_ptr,
    log_alpha_ptr,
    log_beta_ptr,
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
    FAST_SIN: tl.constexpr,
    BLOCK_SAMPLES: tl.constexpr,
    BLOCK_CHANNELS: tl.constexpr,
):
    samples = tl.program_id(0) * BLOCK_SAMPLES + tl.arange(0, BLOCK_SAMPLES)
    channels = tl.program_id(1) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    batch = tl.program_id(2)
    in_channels = channels < num_channels
    mask = (samples < num_samples)[:, None] & in_channels[None, :]
    x_ptrs = _tile_pointers(x_ptr, batch, channels, samples, x_stride_b, x_stride_c, x_stride_t)
    x = tl.load(x_ptrs, mask=mask).to(tl.float32)
    if HAS_BIAS:
        x += _per_channel(bias_ptr, channels, in_channels)
    # The factors come from the checkpoint's logs here, per tile: as separate ATen ops they were 6 more launches a
    # call (casts, exps, add, reciprocal), ~170 of a chunk decode's ~840 kernels.
    alpha = tl.exp(_per_channel(log_alpha_ptr, channels, in_channels))
    inv_beta = 1.0 / (tl.exp(_per_channel(log_beta_ptr, channels, in_channels)) + 1e-9)
    snake = x + inv_beta * _sin_squared(x * alpha, FAST_SIN)
    out_ptrs = _tile_pointers(out_ptr, batch, channels, samples, out_stride_b, out_stride_c, out_stride_t)
    tl.store(out_ptrs, snake.to(out_ptr.dtype.element_ty), mask=mask)


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
    out_stride_b,
    out_stride_c,
    out_stride_t,
    HAS_X_BIAS: tl.constexpr,
    BLOCK_SAMPLES: tl.constexpr,
    BLOCK_CHANNELS: tl.constexpr,
):
    samples = tl.program_id(0) * BLOCK_SAMPLES + tl.arange(0, BLOCK_SAMPLES)
    channels = tl.program_id(1) * BLOCK_CHANNELS + tl.arange(0, BLOCK_CHANNELS)
    batch = tl.program_id(2)
    in_channels = channels < num_channels
    mask = (samples < num_samples)[:, None] & in_channels[None, :]
    x_ptrs = _tile_pointers(x_ptr, batch, channels, samples, x_stride_b, x_stride_c, x_stride_t)
    x = tl.load(x_ptrs, mask=mask).to(tl.float32)
    if HAS_X_BIAS:
        x += _per_channel(x_bias_ptr, channels, in_channels)
    y_ptrs = _tile_pointers(y_ptr, batch, channels, samples, y_stride_b, y_stride_c, y_stride_t)
    y = tl.load(y_ptrs, mask=mask).to(tl.float32) + _per_channel(y_bias_ptr, channels, in_channels)
    out_ptrs = _tile_pointers(out_ptr, batch, channels, samples, out_stride_b, out_stride_c, out_stride_t)
    tl.store(out_ptrs, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


def _tiling(hidden: torch.Tensor) -> tuple[tuple[int, int, int], dict[str, int]]:
    """The launch grid and tile shape for `hidden` [B, C, T]."""
    batch, channels, samples = hidden.shape
    block_channels = min(triton.next_power_of_2(channels), _MAX_BLOCK_CHANNELS)
    block_samples = _TILE_SIZE // block_channels
    # Samples on grid axis 0, the only one that allows more than 65,535 blocks.
    grid = (triton.cdiv(samples, block_samples), triton.cdiv(channels, block_channels), batch)
    return grid, {"BLOCK_SAMPLES": block_samples, "BLOCK_CHANNELS": block_channels}


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
            new tensor in the layout of `hidden` (`new_activation`).

    Returns:
        `out`.
    """
    out = new_activation(hidden) if out is None else out
    assert out.shape == hidden.shape, (out.shape, hidden.shape)
    grid, tile = _tiling(hidden)
    _snake_kernel[grid](
        hidden,
        hidden if bias is None else bias,
        log_alpha,
        log_beta,
        out,
        hidden.shape[1],
        hidden.shape[2],
        *hidden.stride(),
        *out.stride(),
        HAS_BIAS=bias is not None,
        FAST_SIN=out.dtype != torch.float32,
        **tile,
    )
    return out


def add_residual(
    hidden: torch.Tensor, hidden_bias: torch.Tensor | None, update: torch.Tensor, update_bias: torch.Tensor
) -> torch.Tensor:
    """(hidden + hidden_bias) + (update + update_bias), biases [C] per channel, as a new [B, C, T] in the layout of
    `hidden` (`new_activation`).

    `hidden` and `update` may have any strides; `hidden_bias` None adds nothing to `hidden`."""
    assert hidden.shape == update.shape, (hidden.shape, update.shape)
    out = new_activation(hidden)
    grid, tile = _tiling(hidden)
    _residual_kernel[grid](
        hidden,
        hidden if hidden_bias is None else hidden_bias,
        update,
        update_bias,
        out,
        hidden.shape[1],
        hidden.shape[2],
        *hidden.stride(),
        *update.stride(),
        *out.stride(),
        HAS_X_BIAS=hidden_bias is not None,
        **tile,
    )
    return out

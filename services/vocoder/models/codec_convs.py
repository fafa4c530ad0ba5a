"""Causal conv building blocks of the codec decoder, each streamable through a left-context slot.

A causal conv of a one-shot decode pads its input on the left with zeros; streamed, it prepends the
last samples of the previous chunk instead (zeros for a new stream), so both compute the same sums.

Two paths compute the same thing. Off CUDA, the PyTorch chain the reference uses. On CUDA (the fused path),
the elementwise glue runs as the Triton kernels of `codec_kernels`: a SnakeBeta writes straight into the
padded input of the conv after it (no `torch.cat` of the left context), and a conv followed by one of
these kernels runs without its bias, which the kernel adds (no bias pass over the conv output).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from chorus.vocoder.models.codec_state import ContextSlot, StreamContexts

# None: the fused path for CUDA tensors only. Tests set True or False to compare both paths on one device; on the
# CPU the fused path's kernels then run in Triton's interpreter.
FUSED_PATH: bool | None = None


def takes_fused_path(hidden: torch.Tensor) -> bool:
    return hidden.is_cuda if FUSED_PATH is None else FUSED_PATH


class CodecStreamingModule(nn.Module):
    """A module that keeps `context_channels × context_samples` of its input between chunks."""

    context_channels: int = 0
    context_samples: int = 0
    context_slot: ContextSlot | None = None

    def padded_input(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        """A new (B, C_in, context_samples + T) input for `hidden` (B, C_in, T): the left context in its first
        columns, the rest left for the producer of `hidden` to write (then call `forward_padded`)."""
        assert self.context_slot is not None
        batch, channels, num_samples = hidden.shape
        padded = hidden.new_empty(batch, channels, self.context_samples + num_samples)
        padded[..., : self.context_samples].copy_(contexts.read(self.context_slot))
        return padded

    def save_context(self, padded: torch.Tensor, contexts: StreamContexts) -> None:
        """Keeps the last `context_samples` of the padded input (old context included if the chunk is shorter)."""
        assert self.context_slot is not None
        contexts.write(self.context_slot, padded[..., -self.context_samples :])


class CodecCausalConv1d(CodecStreamingModule):
    """Conv1d (stride 1) that sees only past and present samples. (B, C_in, T) → (B, C_out, T)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.context_channels = in_channels
        self.context_samples = (kernel_size - 1) * dilation

    def forward(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        if self.context_samples == 0:
            return self.conv(hidden)
        assert self.context_slot is not None
        return self.forward_padded(torch.cat([contexts.read(self.context_slot), hidden], dim=-1), contexts)

    def forward_padded(self, padded: torch.Tensor, contexts: StreamContexts, bias: bool = True) -> torch.Tensor:
        """The conv of a (B, C_in, context_samples + T) padded input; `bias=False` leaves the bias to the caller."""
        self.save_context(padded, contexts)
        conv = self.conv
        return F.conv1d(padded, conv.weight, conv.bias if bias else None, dilation=conv.dilation, groups=conv.groups)


class CodecCausalConvTranspose1d(CodecStreamingModule):
    """ConvTranspose1d whose overlap tail is cut on the right. (B, C_in, T) → (B, C_out, T·stride).

    Output samples of input step t overlap the next `kernel_size - stride` samples, so a chunk's
    first outputs also need the previous chunk's last input steps (its context).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        if kernel_size < stride:
            raise ValueError(f"kernel_size {kernel_size} < stride {stride} leaves gaps in the output")
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.context_channels = in_channels
        self.context_samples = -(-(kernel_size - stride) // stride)

    def forward(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        if self.context_samples == 0:
            return self.conv(hidden)[..., : hidden.shape[-1] * self.stride]
        assert self.context_slot is not None
        return self.forward_padded(torch.cat([contexts.read(self.context_slot), hidden], dim=-1), contexts)

    def forward_padded(self, padded: torch.Tensor, contexts: StreamContexts, bias: bool = True) -> torch.Tensor:
        """The output of a (B, C_in, context_samples + T) padded input: a strided view of (B, C_out, T·stride);
        `bias=False` leaves the bias to the caller."""
        self.save_context(padded, contexts)
        conv = self.conv
        output = F.conv_transpose1d(padded, conv.weight, conv.bias if bias else None, stride=self.stride)
        start = self.context_samples * self.stride
        return output[..., start : start + (padded.shape[-1] - self.context_samples) * self.stride]


class CodecSnakeBeta(nn.Module):
    """x + sin²(x·e^α) / (e^β + 1e-9), per channel; α and β are stored as logs. (B, C, T) → (B, C, T).

    On the fused path one kernel (`codec_kernels.snake`); elsewhere the PyTorch chain the reference uses."""

    def __init__(self, num_channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(num_channels))
        self.beta = nn.Parameter(torch.zeros(num_channels))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if takes_fused_path(hidden):
            return self.fused(hidden)
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return hidden + (1.0 / (beta + 1e-9)) * torch.sin(hidden * alpha).pow(2)

    def fused(
        self, hidden: torch.Tensor, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """SnakeBeta of `hidden + bias` (bias (C,) or None) as one kernel, into `out` (any strides) or a new tensor."""
        from chorus.vocoder.models.codec_kernels import snake

        return snake(hidden, self.alpha, self.beta, bias, out)


def snake_into_conv(
    act: CodecSnakeBeta,
    conv: CodecCausalConv1d | CodecCausalConvTranspose1d,
    hidden: torch.Tensor,
    contexts: StreamContexts,
    hidden_bias: torch.Tensor | None = None,
    conv_bias: bool = False,
) -> torch.Tensor:
    """`conv(act(hidden + hidden_bias))` on the fused path, the conv's bias left to the caller unless `conv_bias`.

    The snake writes into the conv's padded input, so the left context costs a copy of `context_samples`
    columns, not of the whole activation."""
    padded = conv.padded_input(hidden, contexts)
    act.fused(hidden, hidden_bias, out=padded[..., conv.context_samples :])
    return conv.forward_padded(padded, contexts, bias=conv_bias)


class CodecConvNeXtBlock(nn.Module):
    """Causal depthwise conv (k7) → LayerNorm → MLP ×4 (exact GELU) → γ, plus residual. (B, C, T) → (B, C, T)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CodecCausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        update = self.dwconv(hidden, contexts).transpose(1, 2)
        update = self.pwconv2(F.gelu(self.pwconv1(self.norm(update))))
        return hidden + (self.gamma * update).transpose(1, 2)


class CodecUpsampleStage(nn.ModuleList):
    """Transposed conv (kernel = stride = factor) then a ConvNeXt block; checkpoint keys `upsample.i.{0,1}`."""

    def __init__(self, dim: int, factor: int):
        super().__init__([CodecCausalConvTranspose1d(dim, dim, factor, factor), CodecConvNeXtBlock(dim)])

    def forward(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        for module in self:
            hidden = module(hidden, contexts)
        return hidden


class CodecResidualUnit(nn.Module):
    """SnakeBeta → causal conv k7 (dilated) → SnakeBeta → conv k1, plus residual. (B, C, T) → (B, C, T)."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = CodecSnakeBeta(dim)
        self.conv1 = CodecCausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = CodecSnakeBeta(dim)
        self.conv2 = CodecCausalConv1d(dim, dim, kernel_size=1)

    def forward(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        if takes_fused_path(hidden):
            return self.forward_fused(hidden, contexts)
        update = self.conv1(self.act1(hidden), contexts)
        return hidden + self.conv2(self.act2(update), contexts)

    def forward_fused(
        self, hidden: torch.Tensor, contexts: StreamContexts, hidden_bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The unit's output for input `hidden + hidden_bias` (hidden any strides, bias (C,) or None), with three
        kernels beside the two bias-free convs: snake into conv1's padded input, snake of conv1's output plus its
        bias, and the residual sum with both biases. (B, C, T) → contiguous (B, C, T)."""
        from chorus.vocoder.models.codec_kernels import add_residual

        update = snake_into_conv(self.act1, self.conv1, hidden, contexts, hidden_bias)
        update = self.act2.fused(update, self.conv1.conv.bias)
        update = F.conv1d(update, self.conv2.conv.weight)  # k1: no context to keep
        return add_residual(hidden, hidden_bias, update, self.conv2.conv.bias)


class CodecDecoderBlock(nn.Module):
    """SnakeBeta → transposed conv ×rate (kernel 2·rate) → 3 residual units (dilation 1, 3, 9).

    (B, C, T) → (B, C/2, T·rate); checkpoint keys `block.{0..4}`.
    """

    def __init__(self, in_dim: int, rate: int):
        super().__init__()
        out_dim = in_dim // 2
        self.block = nn.ModuleList(
            [CodecSnakeBeta(in_dim), CodecCausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate)]
            + [CodecResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        )

    def forward(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        if takes_fused_path(hidden):
            return self.forward_fused(hidden, contexts)
        hidden = self.block[0](hidden)
        for module in self.block[1:]:
            hidden = module(hidden, contexts)
        return hidden

    def forward_fused(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        """The transposed conv runs without its bias, and its output slice is never copied: the first residual
        unit reads it strided and adds the bias in its kernels."""
        act, upsample, *units = self.block
        hidden = snake_into_conv(act, upsample, hidden, contexts)
        hidden = units[0].forward_fused(hidden, contexts, hidden_bias=upsample.conv.bias)
        for unit in units[1:]:
            hidden = unit.forward_fused(hidden, contexts)
        return hidden

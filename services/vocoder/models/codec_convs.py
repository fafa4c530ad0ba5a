"""Causal conv building blocks of the codec decoder, each streamable through a left-context slot.

A causal conv of a one-shot decode pads its input on the left with zeros; streamed, it prepends the
last samples of the previous chunk instead (zeros for a new stream), so both compute the same sums.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from chorus.vocoder.models.codec_state import ContextSlot, StreamContexts


class CodecStreamingModule(nn.Module):
    """A module that keeps `context_channels × context_samples` of its input between chunks."""

    context_channels: int = 0
    context_samples: int = 0
    context_slot: ContextSlot | None = None


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
        hidden = torch.cat([contexts.read(self.context_slot), hidden], dim=-1)
        contexts.write(self.context_slot, hidden[..., -self.context_samples :])
        return self.conv(hidden)


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
        num_steps = hidden.shape[-1]
        if self.context_samples:
            assert self.context_slot is not None
            hidden = torch.cat([contexts.read(self.context_slot), hidden], dim=-1)
            contexts.write(self.context_slot, hidden[..., -self.context_samples :])
        start = self.context_samples * self.stride
        return self.conv(hidden)[..., start : start + num_steps * self.stride]


class CodecSnakeBeta(nn.Module):
    """x + sin²(x·e^α) / (e^β + 1e-9), per channel; α and β are stored as logs. (B, C, T) → (B, C, T).

    On CUDA one fused kernel (`snake_kernel`); elsewhere the PyTorch chain the reference uses."""

    def __init__(self, num_channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(num_channels))
        self.beta = nn.Parameter(torch.zeros(num_channels))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.is_cuda:
            from chorus.vocoder.models.snake_kernel import snake

            return snake(hidden, self.alpha, self.beta)
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return hidden + (1.0 / (beta + 1e-9)) * torch.sin(hidden * alpha).pow(2)


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
        update = self.conv1(self.act1(hidden), contexts)
        return hidden + self.conv2(self.act2(update), contexts)


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
        hidden = self.block[0](hidden)
        for module in self.block[1:]:
            hidden = module(hidden, contexts)
        return hidden

"""Causal conv building blocks of the codec decoder, each streamable through a left-context slot.

A causal conv of a one-shot decode pads its input on the left with zeros; streamed, it prepends the
last samples of the previous chunk instead (zeros for a new stream), so both compute the same sums.

Two paths compute the same thing. Off CUDA, the PyTorch chain the reference uses. On CUDA (the fused path),
the elementwise glue runs as the Triton kernels of `codec_kernels`: a SnakeBeta writes straight into the
padded input of the conv after it (no `torch.cat` of the left context), and a conv followed by one of
these kernels runs without its bias, which the kernel adds (no bias pass over the conv output). The fused path
also keeps a channels-last input channels-last ((B, C, T) with (B, T, C) memory, as the pre-transformer's transposed
output is): every buffer it allocates follows its input's layout, and its convs run as 2D convs of (B, C, 1, T)
views (`conv_as_2d`), which cuDNN's NHWC kernels read and write without layout conversions.
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


def conv_as_2d(conv: nn.Conv1d | nn.ConvTranspose1d, hidden: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """`conv(hidden)` as the 2D conv of hidden's (B, C_in, 1, T) view, `bias=False` without the bias; the output
    (B, C_out, T_out) comes back in the layout cuDNN picked: channels-last for a channels-last input or weight.

    ATen's conv1d copies a 3D input to contiguous before it views it as 4D, so a channels-last activation would be
    copied to NCW and cuDNN's bf16 kernels, which run NHWC, would convert it back (and the output too). The 4D view
    of a channels-last (B, C, T) is `torch.channels_last`, which cuDNN reads as it is."""
    weight, bias_or_none = conv.weight.unsqueeze(2), conv.bias if bias else None
    stride, padding, dilation = (1, conv.stride[0]), (0, conv.padding[0]), (1, conv.dilation[0])
    if isinstance(conv, nn.ConvTranspose1d):
        output_padding = (0, conv.output_padding[0])
        output = F.conv_transpose2d(
            hidden.unsqueeze(2), weight, bias_or_none, stride, padding, output_padding, conv.groups, dilation
        )
    else:
        output = F.conv2d(hidden.unsqueeze(2), weight, bias_or_none, stride, padding, dilation, conv.groups)
    return output.squeeze(2)


def run_conv(conv: nn.Conv1d | nn.ConvTranspose1d, hidden: torch.Tensor, bias: bool = True) -> torch.Tensor:
    """`conv(hidden)` (without its bias when `bias=False`): through `conv_as_2d` on the fused path, else the module's
    own 1D conv, as the reference runs it."""
    if takes_fused_path(hidden):
        return conv_as_2d(conv, hidden, bias)
    if bias:
        return conv(hidden)
    if isinstance(conv, nn.ConvTranspose1d):
        return F.conv_transpose1d(hidden, conv.weight, None, conv.stride, groups=conv.groups, dilation=conv.dilation)
    return F.conv1d(hidden, conv.weight, None, conv.stride, dilation=conv.dilation, groups=conv.groups)


@torch.no_grad()
def channels_last_conv_weights_(module: nn.Module) -> None:
    """Restrides every conv weight under `module` in place to channels-last ((O, I, K) with strides (K·I, 1, I)), the
    layout cuDNN's NHWC kernels read: `conv_as_2d` would otherwise copy each weight to it on every call. Names, shapes
    and values stay, so `state_dict` and `load_state_dict` see what they saw; `.to()` keeps the strides."""
    for child in module.modules():
        weight = child.weight if isinstance(child, (nn.Conv1d, nn.ConvTranspose1d)) else None
        if weight is not None and not weight.unsqueeze(2).is_contiguous(memory_format=torch.channels_last):
            weight.data = weight.data.transpose(1, 2).contiguous().transpose(1, 2)


class CodecStreamingModule(nn.Module):
    """A module that keeps `context_channels × context_samples` of its input between chunks."""

    context_channels: int = 0
    context_samples: int = 0
    context_slot: ContextSlot | None = None

    def padded_input(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        """A new (B, C_in, context_samples + T) input for `hidden` (B, C_in, T), in hidden's layout (channels-last
        or contiguous): the left context in its first columns, the rest left for the producer of `hidden` to write
        (then call `forward_padded`)."""
        from chorus.vocoder.models.codec_kernels import new_activation

        assert self.context_slot is not None
        padded = new_activation(hidden, self.context_samples + hidden.shape[-1])
        padded[..., : self.context_samples].copy_(contexts.read(self.context_slot))
        return padded

    def with_context(self, hidden: torch.Tensor, contexts: StreamContexts) -> torch.Tensor:
        """`hidden` (B, C_in, T) with the left context prepended. On the fused path into a `padded_input` (one copy,
        as `torch.cat`, but in hidden's layout: cat's 3D output is always contiguous)."""
        assert self.context_slot is not None
        if not takes_fused_path(hidden):
            return torch.cat([contexts.read(self.context_slot), hidden], dim=-1)
        padded = self.padded_input(hidden, contexts)
        padded[..., self.context_samples :].copy_(hidden)
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
            return run_conv(self.conv, hidden)
        return self.forward_padded(self.with_context(hidden, contexts), contexts)

    def forward_padded(self, padded: torch.Tensor, contexts: StreamContexts, bias: bool = True) -> torch.Tensor:
        """The conv of a (B, C_in, context_samples + T) padded input; `bias=False` leaves the bias to the caller."""
        self.save_context(padded, contexts)
        return run_conv(self.conv, padded, bias)


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
            return run_conv(self.conv, hidden)[..., : hidden.shape[-1] * self.stride]
        return self.forward_padded(self.with_context(hidden, contexts), contexts)

    def forward_padded(self, padded: torch.Tensor, contexts: StreamContexts, bias: bool = True) -> torch.Tensor:
        """The output of a (B, C_in, context_samples + T) padded input: a strided view of (B, C_out, T·stride);
        `bias=False` leaves the bias to the caller."""
        self.save_context(padded, contexts)
        output = run_conv(self.conv, padded, bias)
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
    """Causal depthwise conv (k7) → LayerNorm → MLP ×4 (exact GELU) → γ, plus residual. (B, C, T) → (B, C, T).

    A channels-last input stays channels-last, and the transposes around the MLP are then free (no copies)."""

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
        bias, and the residual sum with both biases. (B, C, T) → (B, C, T) in hidden's layout."""
        from chorus.vocoder.models.codec_kernels import add_residual

        update = snake_into_conv(self.act1, self.conv1, hidden, contexts, hidden_bias)
        update = self.act2.fused(update, self.conv1.conv.bias)
        update = run_conv(self.conv2.conv, update, bias=False)  # k1: no context to keep
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

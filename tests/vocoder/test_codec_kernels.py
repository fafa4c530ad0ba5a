"""The fused CUDA path of the codec decoder computes what the plain PyTorch path computes: each Triton kernel against
its PyTorch chain, and residual units, decoder blocks and the whole decoder through both paths, streamed in chunks
and in one shot.

On CUDA the kernels run compiled; without it, in Triton's interpreter on the CPU (skipped where Triton is not
installed), which runs the same kernel code, strided addressing included, but says nothing of speed."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from torch import nn
from vocoder_helpers import random_codes

from chorus.vocoder.models import codec_convs
from chorus.vocoder.models.codec_convs import CodecDecoderBlock, CodecResidualUnit, CodecStreamingModule
from chorus.vocoder.models.codec_state import ContextSlot, StreamContexts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "set by tests/conftest.py before triton is imported"
    pytest.importorskip("triton", reason="the kernels run in Triton's interpreter on the CPU")

TOLERANCES = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1e-2, "rtol": 8e-3}}
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


@pytest.fixture
def select_path(monkeypatch):
    """`select_path(fused)` makes every module take that path; fp32 convs stay fp32 on CUDA (no TF32)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    return lambda fused: monkeypatch.setattr(codec_convs, "FUSED_PATH", fused)


def _reference_snake(hidden, log_alpha, log_beta, bias):
    """The PyTorch chain in fp32 on the same (already rounded) inputs, rounded once at the end."""
    x = hidden.float() + (0.0 if bias is None else bias.float()[:, None])
    alpha = log_alpha.float().exp()[:, None]
    inv_beta = 1.0 / (log_beta.float().exp()[:, None] + 1e-9)
    return (x + inv_beta * torch.sin(x * alpha).pow(2)).to(hidden.dtype)


def _strided(batch: int, channels: int, samples: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """Random (B, C, T) values, as a slice of wider rows (a transposed conv's output) or channels-last."""
    if layout == "sliced":
        return (torch.randn(batch, channels, samples + 9, device=DEVICE) * 3).to(dtype)[..., 4 : 4 + samples]
    return (torch.randn(batch, samples, channels, device=DEVICE) * 3).to(dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["sliced", "channels_last"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("batch", "channels", "samples", "context"), [(3, 5, 37, 6), (2, 4, 1, 54), (1, 3, 2501, 1)])
def test_snake_writes_into_the_padded_input(dtype, layout, with_bias, batch, channels, samples, context):
    """snake(x + bias) lands in the chunk columns of a conv's padded input; its left-context columns stay."""
    from chorus.vocoder.models.codec_kernels import snake

    torch.manual_seed(0)
    hidden = _strided(batch, channels, samples, dtype, layout)
    log_alpha, log_beta = torch.randn(2, channels, device=DEVICE) * 0.5
    bias = torch.randn(channels, device=DEVICE).to(dtype) if with_bias else None
    padded = torch.full((batch, channels, context + samples), 7.0, device=DEVICE, dtype=dtype)
    snake(hidden, log_alpha, log_beta, bias, out=padded[..., context:])
    assert (padded[..., :context] == 7.0).all()
    expected = _reference_snake(hidden, log_alpha, log_beta, bias)
    torch.testing.assert_close(padded[..., context:], expected, **TOLERANCES[dtype])
    torch.testing.assert_close(snake(hidden, log_alpha, log_beta, bias), expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_hidden_bias", [False, True])
@pytest.mark.parametrize(("batch", "channels", "samples"), [(3, 5, 37), (2, 4, 1), (1, 3, 2501)])
def test_add_residual_sums_both_biased_inputs(dtype, with_hidden_bias, batch, channels, samples):
    from chorus.vocoder.models.codec_kernels import add_residual

    torch.manual_seed(0)
    hidden = _strided(batch, channels, samples, dtype, "sliced")
    update = _strided(batch, channels, samples, dtype, "channels_last")
    hidden_bias = torch.randn(channels, device=DEVICE).to(dtype) if with_hidden_bias else None
    update_bias = torch.randn(channels, device=DEVICE).to(dtype)
    out = add_residual(hidden, hidden_bias, update, update_bias)
    assert out.is_contiguous()
    biased_hidden = hidden.float() + (0.0 if hidden_bias is None else hidden_bias.float()[:, None])
    expected = (biased_hidden + (update.float() + update_bias.float()[:, None])).to(dtype)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


def _random_module(module: nn.Module) -> tuple[nn.Module, int]:
    """`module` on DEVICE with random biases and snake parameters (zero at init), and context slots assigned as
    `CodecDecoder` assigns them; returns it and the size of its flat context row."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.rsplit(".", 1)[-1] in ("bias", "alpha", "beta"):
                parameter.normal_(0.0, 0.5)
    context_size = 0
    for child in module.modules():
        if isinstance(child, CodecStreamingModule) and child.context_samples:
            child.context_slot = ContextSlot(context_size, child.context_channels, child.context_samples)
            context_size += child.context_slot.size
    return module.to(DEVICE), context_size


def _streamed(module: nn.Module, hidden: torch.Tensor, contexts: torch.Tensor, chunk_sizes: list[int]):
    """The module's output for `hidden` fed in chunks of `chunk_sizes` samples, and the contexts it leaves."""
    pieces, start = [], 0
    for size in chunk_sizes:
        stream_contexts = StreamContexts(contexts)
        pieces.append(module(hidden[..., start : start + size], stream_contexts))
        contexts, start = stream_contexts.new, start + size
    return torch.cat(pieces, dim=-1), contexts


@pytest.mark.parametrize(
    ("module_class", "channels", "dilation_or_rate"),
    [(CodecResidualUnit, 6, 1), (CodecResidualUnit, 6, 9), (CodecDecoderBlock, 8, 3), (CodecDecoderBlock, 4, 5)],
)
@torch.inference_mode()
def test_fused_module_equals_plain_streamed_or_not(select_path, module_class, channels, dilation_or_rate):
    """Both paths from the same (non-zero) left contexts: in one shot, and in chunks shorter and longer than the
    contexts (each chunk's input a strided slice)."""
    module, context_size = _random_module(module_class(channels, dilation_or_rate))
    hidden = torch.randn(2, channels, 40, device=DEVICE)
    contexts = torch.randn(2, context_size, device=DEVICE)
    select_path(False)
    expected, expected_contexts = _streamed(module, hidden, contexts, [40])
    select_path(True)
    for chunk_sizes in ([40], [1, 2, 30, 7]):
        output, new_contexts = _streamed(module, hidden, contexts, chunk_sizes)
        torch.testing.assert_close(output, expected, **TOLERANCES[torch.float32])
        torch.testing.assert_close(new_contexts, expected_contexts, **TOLERANCES[torch.float32])


@torch.inference_mode()
def test_fused_decoder_equals_plain_streamed_or_not(select_path, tiny_codec):
    decoder = copy.deepcopy(tiny_codec.decoder).to(DEVICE)
    codes = random_codes(6, seed=5, batch_size=2).to(DEVICE)
    select_path(False)
    expected, expected_state = decoder(codes, decoder.new_state(2))
    select_path(True)
    one_shot, state = decoder(codes, decoder.new_state(2))
    torch.testing.assert_close(one_shot, expected, **TOLERANCES[torch.float32])
    torch.testing.assert_close(state.conv_contexts, expected_state.conv_contexts, **TOLERANCES[torch.float32])
    state, pieces = decoder.new_state(2), []
    for start, stop in ((0, 1), (1, 3), (3, 6)):
        piece, state = decoder(codes[:, start:stop], state)
        pieces.append(piece)
    assert (torch.cat(pieces, dim=1) - one_shot).abs().max().item() <= 1e-5

"""The fused CUDA path of the codec decoder computes what the plain PyTorch path computes: each Triton kernel against
its PyTorch chain, and residual units, decoder blocks and the whole decoder through both paths, streamed in chunks
and in one shot. The fused path keeps a channels-last activation ((B, C, T) with (B, T, C) memory) channels-last:
the kernels write in the layout of their input, and the decoder's activations stay so from quantizer to last conv.

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
from chorus.vocoder.models.codec_convs import (
    CodecDecoderBlock,
    CodecResidualUnit,
    CodecStreamingModule,
    channels_last_conv_weights_,
)
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


LAYOUTS = ["contiguous", "sliced", "channels_last", "channels_last_sliced"]


def _in_layout(values: torch.Tensor, layout: str) -> torch.Tensor:
    """The same (B, C, T) values in one of `LAYOUTS`: contiguous, channels-last (strides (T·C, 1, C)), or the middle
    of wider rows of either (a transposed conv's output slice), whose columns outside are NaN."""
    if not layout.endswith("sliced"):
        return _channels_last(values) if layout == "channels_last" else values.contiguous()
    batch, channels, samples = values.shape
    wide = values.new_full((batch, channels, samples + 9), float("nan"))
    wide = _channels_last(wide) if layout.startswith("channels_last") else wide
    wide[..., 4 : 4 + samples] = values
    return wide[..., 4 : 4 + samples]


def _strided(batch: int, channels: int, samples: int, dtype: torch.dtype, layout: str) -> torch.Tensor:
    """Random (B, C, T) values in `layout`."""
    return _in_layout((torch.randn(batch, channels, samples, device=DEVICE) * 3).to(dtype), layout)


def _channels_last(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.transpose(1, 2).contiguous().transpose(1, 2)


def _is_channels_last(tensor: torch.Tensor) -> bool:
    """Channels-last and dense: strides (T·C, 1, C), those of size-1 dimensions aside."""
    return tensor.unsqueeze(2).is_contiguous(memory_format=torch.channels_last)


def _expect_layout_of(out: torch.Tensor, hidden: torch.Tensor) -> None:
    """A kernel's new output: dense channels-last for a channels-last input (sliced or not), else contiguous."""
    channels_last = hidden.stride(1) < hidden.stride(2)
    assert _is_channels_last(out) if channels_last else out.is_contiguous(), (hidden.stride(), out.stride())


# (2, 40, 70): more channels than a tile's 32
SHAPES = [(3, 5, 37), (2, 4, 1), (1, 3, 2501), (2, 40, 70)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("padded_layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize(("batch", "channels", "samples"), SHAPES)
def test_snake_writes_into_the_padded_input(dtype, layout, padded_layout, with_bias, batch, channels, samples):
    """snake(x + bias) lands in the chunk columns of a conv's padded input; its left-context columns stay."""
    from chorus.vocoder.models.codec_kernels import snake

    torch.manual_seed(0)
    context = 6
    hidden = _strided(batch, channels, samples, dtype, layout)
    log_alpha, log_beta = torch.randn(2, channels, device=DEVICE) * 0.5
    bias = torch.randn(channels, device=DEVICE).to(dtype) if with_bias else None
    padded = _in_layout(
        torch.full((batch, channels, context + samples), 7.0, device=DEVICE, dtype=dtype), padded_layout
    )
    snake(hidden, log_alpha, log_beta, bias, out=padded[..., context:])
    assert (padded[..., :context] == 7.0).all()
    expected = _reference_snake(hidden, log_alpha, log_beta, bias)
    torch.testing.assert_close(padded[..., context:], expected, **TOLERANCES[dtype])
    out = snake(hidden, log_alpha, log_beta, bias)
    _expect_layout_of(out, hidden)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_hidden_bias", [False, True])
@pytest.mark.parametrize(
    ("hidden_layout", "update_layout"),
    [("sliced", "channels_last"), ("channels_last_sliced", "channels_last"), ("contiguous", "contiguous")],
)
@pytest.mark.parametrize(("batch", "channels", "samples"), SHAPES)
def test_add_residual_sums_both_biased_inputs(
    dtype, with_hidden_bias, hidden_layout, update_layout, batch, channels, samples
):
    from chorus.vocoder.models.codec_kernels import add_residual

    torch.manual_seed(0)
    hidden = _strided(batch, channels, samples, dtype, hidden_layout)
    update = _strided(batch, channels, samples, dtype, update_layout)
    hidden_bias = torch.randn(channels, device=DEVICE).to(dtype) if with_hidden_bias else None
    update_bias = torch.randn(channels, device=DEVICE).to(dtype)
    out = add_residual(hidden, hidden_bias, update, update_bias)
    _expect_layout_of(out, hidden)
    biased_hidden = hidden.float() + (0.0 if hidden_bias is None else hidden_bias.float()[:, None])
    expected = (biased_hidden + (update.float() + update_bias.float()[:, None])).to(dtype)
    torch.testing.assert_close(out, expected, **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "channels", "samples"), [(2, 40, 70), (3, 5, 1)])
def test_kernels_compute_the_same_in_every_layout(dtype, batch, channels, samples):
    """Bit for bit: a kernel's result doesn't depend on how its input is laid out, only its output's layout does."""
    from chorus.vocoder.models.codec_kernels import add_residual, snake

    torch.manual_seed(0)
    hidden, update = (torch.randn(2, batch, channels, samples, device=DEVICE) * 3).to(dtype)
    log_alpha, log_beta = torch.randn(2, channels, device=DEVICE) * 0.5
    bias, update_bias = torch.randn(2, channels, device=DEVICE).to(dtype)
    expected_snake = snake(hidden, log_alpha, log_beta, bias)
    expected_sum = add_residual(hidden, bias, update, update_bias)
    for layout in LAYOUTS:
        strided = _in_layout(hidden, layout)
        out = snake(strided, log_alpha, log_beta, bias)
        _expect_layout_of(out, strided)
        assert torch.equal(out, expected_snake), layout
        out = add_residual(strided, bias, _in_layout(update, layout), update_bias)
        _expect_layout_of(out, strided)
        assert torch.equal(out, expected_sum), layout


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


def _expect_channels_last_outputs(modules: list[nn.Module]) -> None:
    """Makes every later call of `modules` check that it returns a dense channels-last (B, C, T)."""

    def check(module, inputs, output):
        assert _is_channels_last(output), (type(module).__name__, output.shape, output.stride())

    for module in modules:
        module.register_forward_hook(check)


@pytest.mark.parametrize(
    ("module_class", "channels", "dilation_or_rate"),
    [(CodecResidualUnit, 6, 1), (CodecResidualUnit, 6, 9), (CodecDecoderBlock, 8, 3), (CodecDecoderBlock, 4, 5)],
)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@torch.inference_mode()
def test_fused_module_equals_plain_streamed_or_not(select_path, module_class, channels, dilation_or_rate, layout):
    """Both paths from the same (non-zero) left contexts: in one shot, and in chunks shorter and longer than the
    contexts (each chunk's input a strided slice); a channels-last input gives a channels-last output."""
    module, context_size = _random_module(module_class(channels, dilation_or_rate))
    hidden = _in_layout(torch.randn(2, channels, 40, device=DEVICE), layout)
    contexts = torch.randn(2, context_size, device=DEVICE)
    select_path(False)
    expected, expected_contexts = _streamed(module, hidden, contexts, [40])
    select_path(True)
    if layout == "channels_last":
        _expect_channels_last_outputs([module])
    for chunk_sizes in ([40], [1, 2, 30, 7]):
        output, new_contexts = _streamed(module, hidden, contexts, chunk_sizes)
        torch.testing.assert_close(output, expected, **TOLERANCES[torch.float32])
        torch.testing.assert_close(new_contexts, expected_contexts, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("channels_last_weights", [False, True])
@torch.inference_mode()
def test_fused_decoder_equals_plain_streamed_or_not(select_path, tiny_codec, channels_last_weights):
    """The fused decode keeps its activations channels-last from the quantizer on (the runner's CUDA setup also
    restrides the conv weights) and equals the plain one, in one shot and streamed in chunks of 1, 2 and 3 frames."""
    decoder = copy.deepcopy(tiny_codec.decoder).to(DEVICE)
    codes = random_codes(6, seed=5, batch_size=2).to(DEVICE)
    select_path(False)
    expected, expected_state = decoder(codes, decoder.new_state(2))
    if channels_last_weights:
        channels_last_conv_weights_(decoder)
    select_path(True)
    _expect_channels_last_outputs([decoder.quantizer, decoder.pre_conv, *decoder.upsample, *decoder.decoder[:-2]])
    one_shot, state = decoder(codes, decoder.new_state(2))
    torch.testing.assert_close(one_shot, expected, **TOLERANCES[torch.float32])
    torch.testing.assert_close(state.conv_contexts, expected_state.conv_contexts, **TOLERANCES[torch.float32])
    state, pieces = decoder.new_state(2), []
    for start, stop in ((0, 1), (1, 3), (3, 6)):
        piece, state = decoder(codes[:, start:stop], state)
        pieces.append(piece)
    assert (torch.cat(pieces, dim=1) - one_shot).abs().max().item() <= 1e-5


def test_channels_last_weights_keep_names_and_values(tiny_codec):
    """Restrided conv weights: (O, I, K) with strides (K·I, 1, I); state_dict keys and values as before, and loading
    a state_dict or changing dtype keeps the strides."""
    decoder = copy.deepcopy(tiny_codec.decoder)
    before = {name: tensor.clone() for name, tensor in decoder.state_dict().items()}
    channels_last_conv_weights_(decoder)
    after = decoder.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[name], tensor) for name, tensor in before.items())
    weight = decoder.decoder[1].block[2].conv1.conv.weight
    _, in_channels, kernel_size = weight.shape
    assert weight.stride() == (kernel_size * in_channels, 1, in_channels)
    decoder.load_state_dict(before)
    assert decoder.decoder[1].block[2].conv1.conv.weight.stride() == weight.stride()
    assert decoder.to(torch.float64).decoder[1].block[2].conv1.conv.weight.stride() == weight.stride()

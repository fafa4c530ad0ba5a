"""`few_rows_matmul` computes `x @ weightᵀ` for one and two rows, ragged shapes included, alone and with its fused
RMS norm, SwiGLU and residual add; on CUDA in bf16 it rounds where the PyTorch layer rounds.

On CUDA the kernel runs compiled; without it, in Triton's interpreter on the CPU (skipped where Triton is not
installed), which runs the same kernel code but says nothing of speed. The interpreter truncates when it converts
fp32 to bf16 where the GPU rounds to nearest, so the CPU tests run in fp32 (where the kernel's roundings are exact)
and the bf16 rounding points are tested on CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "set by tests/conftest.py before triton is imported"
    pytest.importorskip("triton", reason="the kernel runs in Triton's interpreter on the CPU")

from chorus.talker.models.few_rows_matmul import MAX_ROWS, few_rows_matmul  # noqa: E402
from chorus.talker.models.qwen3_layers import rms_norm  # noqa: E402

EPS = 1e-6
# The 0.6B decode step's projections: QKV, output, gate-up, down.
DECODE_SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]
RAGGED_SHAPES = [(38, 300), (6, 2500)]  # partial blocks of N and of K; more than one block of K (1024 at most)


def _inputs(num_rows: int, num_cols: int, depth: int, dtype: torch.dtype = torch.float32):
    """x, weight, norm weight and a residual of the output's shape (half the weight's rows wide for SwiGLU)."""
    generator = torch.Generator().manual_seed(num_rows * 1000 + num_cols + depth)
    x = torch.randn(num_rows, depth, generator=generator)
    weight = torch.randn(num_cols, depth, generator=generator) * depth**-0.5
    norm_weight = torch.rand(depth, generator=generator) + 0.5
    residual = torch.randn(num_rows, num_cols, generator=generator)
    return (tensor.to(DEVICE, dtype) for tensor in (x, weight, norm_weight, residual))


def _layer_ops(x, weight, norm_weight=None, swiglu=False, residual=None):
    """What the PyTorch layer computes, one op at a time (rounding after each in x's dtype)."""
    out = F.linear(x if norm_weight is None else rms_norm(x, norm_weight, EPS), weight)
    if swiglu:
        gate, up = out.chunk(2, dim=-1)
        out = F.silu(gate) * up
    return out if residual is None else residual + out


FUSIONS = {
    "product": {},
    "norm": {"norm": True},
    "norm, swiglu": {"norm": True, "swiglu": True},
    "residual": {"residual": True},
}


def _both(num_rows, num_cols, depth, dtype, norm=False, swiglu=False, residual=False):
    x, weight, norm_weight, extra = _inputs(num_rows, num_cols, depth, dtype)
    norm_weight = norm_weight if norm else None
    extra = extra[:, : num_cols // 2 if swiglu else num_cols] if residual else None
    got = few_rows_matmul(x, weight, norm_weight, EPS, swiglu=swiglu, residual=extra)
    if dtype == torch.float32:  # the reference in float64, as exact as the comparison needs
        x, weight, norm_weight, extra = (t if t is None else t.double() for t in (x, weight, norm_weight, extra))
    return got, _layer_ops(x, weight, norm_weight, swiglu, extra)


@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize(("num_cols", "depth"), RAGGED_SHAPES)
@pytest.mark.parametrize("fusion", FUSIONS)
def test_the_kernel_computes_what_the_layer_does(num_rows, num_cols, depth, fusion):
    got, expected = _both(num_rows, num_cols, depth, torch.float32, **FUSIONS[fusion])
    assert got.dtype == torch.float32 and got.shape == expected.shape
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_it_reads_strided_rows():
    x, weight, _, _ = _inputs(2, 37, 300)
    wide = torch.zeros(2, 400, device=DEVICE)
    wide[:, :300] = x
    torch.testing.assert_close(few_rows_matmul(wide[:, :300], weight), few_rows_matmul(x, weight), atol=0, rtol=0)


def test_it_refuses_what_it_does_not_compute():
    x, weight, norm_weight, residual = _inputs(MAX_ROWS + 1, 8, 16)
    with pytest.raises(AssertionError):  # too many rows
        few_rows_matmul(x, weight)
    with pytest.raises(AssertionError):  # a norm weight of another width
        few_rows_matmul(x[:1], weight, norm_weight[:8], EPS)
    with pytest.raises(AssertionError):  # a residual of the full width with SwiGLU, which halves it
        few_rows_matmul(x[:1], weight, swiglu=True, residual=residual[:1])


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the compiled kernel needs CUDA")
@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize("fusion", FUSIONS)
def test_on_cuda_it_rounds_where_the_layer_rounds(num_rows, fusion):
    """In bf16 the only difference from cuBLAS and PyTorch's element-wise ops is the order of the fp32 additions:
    a rounding step of the product, carried through the fused ops."""
    for num_cols, depth in DECODE_SHAPES:
        got, expected = _both(num_rows, num_cols, depth, torch.bfloat16, **FUSIONS[fusion])
        assert got.dtype == torch.bfloat16 and got.shape == expected.shape
        torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("batch", range(1, MAX_ROWS + 1))
def test_a_stack_decodes_through_it_as_through_the_unfused_kernel_path(batch):
    """Decode steps of `batch` rows (the code predictor's first step feeds 2 tokens a row, within MAX_ROWS at batch
    1) through `decode_few_rows` give the hidden states and cache entries of the unfused decode path, and a head
    after the stack with the final norm fused in (`norm_and_project`) the logits of the norm then the head."""
    from chorus.talker.models import decode_kernels
    from chorus.talker.models import few_rows_matmul as few_rows_module
    from chorus.talker.models.qwen3_layers import Qwen3BlockConfig, Qwen3DecoderStack

    config = Qwen3BlockConfig(64, 96, 2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e4)
    torch.manual_seed(batch)
    stack = Qwen3DecoderStack(config)
    with torch.no_grad():
        for name, parameter in stack.named_parameters():
            scale = 0.1 if "norm" in name else config.hidden_size**-0.5
            parameter.copy_(torch.randn_like(parameter) * scale + (1.0 if "norm" in name else 0.0))
    stack.to(DEVICE).decode_kernels = decode_kernels
    for layer in stack.layers:
        layer.self_attn.fuse_projections()
        layer.mlp.fuse_projections()
        layer.decode_kernels, layer.decode_output_and_mlp = decode_kernels, layer.output_and_mlp
    table = torch.arange(1, 1 + batch, dtype=torch.int32, device=DEVICE)[:, None]  # one block of 16 a row
    tokens_per_step = [2, 1, 1] if batch == 1 else [1, 1, 1]
    inputs = [torch.randn(batch, num_tokens, config.hidden_size, device=DEVICE) for num_tokens in tokens_per_step]

    head = torch.randn(24, config.hidden_size, device=DEVICE) * config.hidden_size**-0.5  # a head after the stack

    def decode(few_rows):
        """Per step the hidden states and the head's logits of the last token; the caches after the steps."""
        stack.few_rows_matmul = few_rows
        caches = torch.zeros(config.num_hidden_layers, 2, 1 + batch, 2, 16, 16, device=DEVICE)
        outputs, position = [], 0
        with torch.inference_mode():
            for embeds in inputs:
                positions = torch.arange(position, position + embeds.shape[1], device=DEVICE).repeat(batch, 1)
                assert stack.takes_few_rows(positions) == (few_rows is not None)
                if few_rows is None:
                    hidden = stack(embeds, positions, list(caches), 16, table)
                    outputs.append((hidden, F.linear(hidden[:, -1], head)))
                else:
                    residual = stack.few_rows_residual(embeds, positions, list(caches), table)
                    outputs.append((stack.norm(residual), stack.norm_and_project(residual[:, -1], head)))
                position += embeds.shape[1]
        return outputs, caches

    (unfused, unfused_caches), (fused, fused_caches) = decode(None), decode(few_rows_module)
    torch.testing.assert_close(fused, unfused, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused_caches, unfused_caches, atol=1e-5, rtol=1e-5)

"""The fused SnakeBeta kernel computes what the PyTorch chain computes in fp32, up to rounding its output to the
activation dtype, for any row length and layout (GPU only)."""

from __future__ import annotations

import math

import pytest
import torch

from chorus.vocoder.models.codec_convs import CodecSnakeBeta

pytestmark = pytest.mark.gpu

TOLERANCES = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 1e-2, "rtol": 8e-3}}


def _reference(module: CodecSnakeBeta, hidden: torch.Tensor) -> torch.Tensor:
    """The PyTorch chain in fp32 on the same (already rounded) parameters and inputs, rounded once at the end."""
    alpha = torch.exp(module.alpha.float())[None, :, None]
    beta = torch.exp(module.beta.float())[None, :, None]
    hidden32 = hidden.float()
    return (hidden32 + (1.0 / (beta + 1e-9)) * torch.sin(hidden32 * alpha).pow(2)).to(hidden.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "channels", "samples"), [(3, 96, 48_000), (1, 1536, 25), (2, 7, 1)])
def test_fused_snake_matches_the_pytorch_chain(dtype, batch, channels, samples):
    torch.manual_seed(0)
    module = CodecSnakeBeta(channels)
    with torch.no_grad():
        module.alpha.normal_(0.0, 0.5)
        module.beta.normal_(0.0, 0.5)
    module = module.to("cuda", dtype)
    hidden = (torch.randn(batch, channels, samples, device="cuda") * 3).to(dtype)
    with torch.inference_mode():
        expected = _reference(module, hidden)
        torch.testing.assert_close(module(hidden), expected, **TOLERANCES[dtype])
        strided = hidden.transpose(1, 2).contiguous().transpose(1, 2)  # same values, channels-last layout
        torch.testing.assert_close(module(strided), expected, **TOLERANCES[dtype])


def test_the_fast_sine_matches_the_exact_one_far_from_zero():
    """16-bit outputs take the special-function unit's sine after reducing the argument by π; on its own that sine's
    error grows with |x|. Arguments up to ±10⁴ (α = 10⁴ on |x| ≤ 1), fp32 outputs so nothing rounds it away: the
    two sines' snakes agree within 2e-6."""
    from chorus.vocoder.models import codec_kernels  # Triton: imported where the GPU tests run

    hidden = torch.linspace(-1.0, 1.0, 1_000_001, device="cuda").view(1, 1, -1)
    log_alpha = torch.full((1,), math.log(1e4), device="cuda")
    log_beta = torch.zeros(1, device="cuda")
    grid, tile = codec_kernels._tiling(hidden)
    outputs = []
    for fast in (False, True):
        out = torch.empty_like(hidden)
        arguments = (hidden, hidden, log_alpha, log_beta, out, 1, hidden.shape[2], *hidden.stride(), *out.stride())
        codec_kernels._snake_kernel[grid](*arguments, HAS_BIAS=False, FAST_SIN=fast, **tile)
        outputs.append(out)
    exact, fast = outputs
    assert exact.sub(hidden).abs().max() > 0.99  # the arguments do cover whole periods
    torch.testing.assert_close(fast, exact, atol=2e-6, rtol=0)

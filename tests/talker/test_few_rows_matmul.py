"""`few_rows_matmul` computes `x @ weightᵀ` for every block size its autotuning may pick, ragged shapes included, and
`FewRowsLinear` is the Linear it replaces wherever it does not take the kernel.

On CUDA the kernel runs compiled; without it, in Triton's interpreter on the CPU (skipped where Triton is not
installed), which runs the same kernel code but says nothing of speed."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "set by tests/conftest.py before triton is imported"
    pytest.importorskip("triton", reason="the kernel runs in Triton's interpreter on the CPU")

from chorus.talker.models.few_rows_matmul import (  # noqa: E402 — after the interpreter check
    MAX_ROWS,
    FewRowsLinear,
    _configs,
    _few_rows_matmul_kernel,
    _prune,
    few_rows_matmul,
)


def _inputs(num_rows: int, num_cols: int, depth: int, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(num_rows * 1000 + num_cols + depth)
    x = torch.randn(num_rows, depth, generator=generator).to(DEVICE, dtype)
    weight = (torch.randn(num_cols, depth, generator=generator) * depth**-0.5).to(DEVICE, dtype)
    return x, weight


@pytest.mark.parametrize("num_rows", [1, 3])
def test_every_config_it_may_pick_computes_the_product(num_rows):
    """Ragged on every side: 37 columns and a depth of 300 leave partial blocks of N and of K."""
    num_cols, depth = 37, 300
    x, weight = _inputs(num_rows, num_cols, depth)
    expected = x.double() @ weight.double().T
    configs = _prune(_configs(), {"num_rows": num_rows})
    assert configs and len(configs) < len(_configs()), "the register bound drops the largest tiles"
    for config in configs:
        out = torch.full((num_rows, num_cols), float("nan"), device=DEVICE)
        block_n = config.kwargs["BLOCK_N"]
        _few_rows_matmul_kernel.fn[(-(-num_cols // block_n),)](
            x,
            weight,
            out,
            num_rows,
            num_cols,
            depth,
            x.stride(0),
            weight.stride(0),
            out.stride(0),
            BLOCK_M=4 if num_rows > 2 else num_rows,
            **config.kwargs,
        )
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5, msg=f"config {config}")


def test_a_linear_off_the_kernel_path_is_the_linear_it_replaces():
    linear = torch.nn.Linear(64, 48, bias=False)
    replaced = FewRowsLinear(linear)
    assert replaced.weight is linear.weight
    x = torch.randn(2, MAX_ROWS + 1, 64)  # past MAX_ROWS: F.linear on every device
    torch.testing.assert_close(replaced(x), linear(x), atol=0, rtol=0)
    x = torch.randn(1, 1, 64)  # on the CPU: F.linear
    torch.testing.assert_close(replaced(x), linear(x), atol=0, rtol=0)
    with pytest.raises(AssertionError):
        FewRowsLinear(torch.nn.Linear(4, 4, bias=True))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the autotuned launch needs CUDA")
@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
def test_the_op_on_cuda_matches_cublas_at_bf16_rounding(num_rows):
    """The decode step's shapes at 0.6B (QKV, output, gate-up and down projections), through the custom op, in
    bf16: the only difference from cuBLAS is the order of the fp32 additions, so at most a rounding step."""
    for num_cols, depth in ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)):
        x, weight = _inputs(num_rows, num_cols, depth, torch.bfloat16)
        out = few_rows_matmul(x, weight)
        expected = torch.nn.functional.linear(x, weight)
        assert out.dtype == torch.bfloat16 and out.shape == expected.shape
        torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=1e-2)

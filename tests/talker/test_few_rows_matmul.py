"""`few_rows_matmul` computes `x @ weightᵀ` for one and two rows, ragged shapes included, and `FewRowsLinear` is the
Linear it replaces wherever it does not take the kernel.

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

from chorus.talker.models.few_rows_matmul import MAX_ROWS, FewRowsLinear, few_rows_matmul  # noqa: E402

# The 0.6B decode step's projections: QKV, output, gate-up, down.
DECODE_SHAPES = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]


def _inputs(num_rows: int, num_cols: int, depth: int, dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(num_rows * 1000 + num_cols + depth)
    x = torch.randn(num_rows, depth, generator=generator).to(DEVICE, dtype)
    weight = (torch.randn(num_cols, depth, generator=generator) * depth**-0.5).to(DEVICE, dtype)
    return x, weight


@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize(
    ("num_cols", "depth"),
    [(37, 300), (6, 2500)],  # partial blocks of N and of K; more than one block of K (1024 at most)
)
def test_the_kernel_computes_the_product(num_rows, num_cols, depth):
    x, weight = _inputs(num_rows, num_cols, depth)
    out = few_rows_matmul(x, weight)
    torch.testing.assert_close(out.double(), x.double() @ weight.double().T, atol=1e-5, rtol=1e-5)


def test_it_reads_strided_rows():
    x, weight = _inputs(2, 37, 300)
    wide = torch.zeros(2, 400, device=DEVICE)
    wide[:, :300] = x
    torch.testing.assert_close(few_rows_matmul(wide[:, :300], weight), few_rows_matmul(x, weight), atol=0, rtol=0)


def test_a_linear_off_the_kernel_path_is_the_linear_it_replaces():
    linear = torch.nn.Linear(64, 48, bias=False)
    replaced = FewRowsLinear(linear)
    assert replaced.weight is linear.weight
    x = torch.randn(1, MAX_ROWS + 1, 64)  # past MAX_ROWS: F.linear on every device
    torch.testing.assert_close(replaced(x), linear(x), atol=0, rtol=0)
    x = torch.randn(1, 1, 64)  # on the CPU: F.linear
    torch.testing.assert_close(replaced(x), linear(x), atol=0, rtol=0)
    with pytest.raises(AssertionError):
        FewRowsLinear(torch.nn.Linear(4, 4, bias=True))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="the compiled kernel needs CUDA")
@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
def test_on_cuda_it_matches_cublas_at_bf16_rounding(num_rows):
    """In bf16 the only difference from cuBLAS is the order of the fp32 additions: at most a rounding step."""
    for num_cols, depth in DECODE_SHAPES:
        x, weight = _inputs(num_rows, num_cols, depth, torch.bfloat16)
        out = FewRowsLinear(torch.nn.Linear(depth, num_cols, bias=False, device=DEVICE, dtype=torch.bfloat16))
        out.weight = torch.nn.Parameter(weight, requires_grad=False)
        expected = torch.nn.functional.linear(x, weight)
        result = out(x[:, None])[:, 0]
        assert result.dtype == torch.bfloat16 and result.shape == expected.shape
        torch.testing.assert_close(result.float(), expected.float(), atol=2e-2, rtol=1e-2)

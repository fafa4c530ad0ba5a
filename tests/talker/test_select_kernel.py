"""The k-th-largest kernel returns what `torch.topk(x, 64).values[k - 1]` returns, bit for bit — ties counted, -inf
rows and padding included — and `warp` through it keeps exactly what `warp` through topk keeps, eager and compiled;
the one-launch draw picks the ids `sample_code` picks through topk.

On CUDA it runs compiled; without it, in Triton's interpreter on the CPU (skipped where Triton is not installed)."""

from __future__ import annotations

import os

import pytest
import torch

from chorus.talker import sampling
from chorus.talker.sampling import FAST_TOP_K, RowParams, sample_code, sample_code_and_embed, warp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "set by tests/conftest.py before triton is imported"
    pytest.importorskip("triton", reason="the kernel runs in Triton's interpreter on the CPU")

from chorus.talker.models.select_kernel import draw_top_k, kth_largest  # noqa: E402  (needs Triton)


def _hard_rows(batch: int, vocab_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16-rounded scores `[batch, vocab_size]` (many ties) with banned ids, plus the awkward rows, and `k [batch]`
    covering 1 and 64."""
    scores = (torch.randn(batch, vocab_size, generator=generator) * 4).bfloat16().float()
    scores[torch.rand(batch, vocab_size, generator=generator) < 0.1] = float("-inf")
    k = torch.randint(1, FAST_TOP_K + 1, (batch,), generator=generator)
    k[0] = 1
    if batch > 1:
        k[1] = FAST_TOP_K
        scores[2] = 1.5  # all equal
        scores[3] = -2.0  # all equal, negative
        scores[4] = float("-inf")  # all banned
        scores[5] = float("-inf")
        scores[5, 100:110] = torch.tensor([3.0, 3.0, 2.0, -1.0, 0.5, 0.5, 0.5, 7.0, -0.0, 0.0])  # 10 finite, k > 10
        k[5] = 40
        scores[6, :200] = scores[6, 0]  # a tie of 200 across the k-th place
        scores[7] = scores[7].abs()
        scores[7, -FAST_TOP_K:] = float("inf")  # k ≤ 64 finds +inf
        scores[8] = float("-inf")
        scores[8, :70] = torch.tensor([0.0, -0.0]).repeat(35)  # equal as floats, not as keys
        scores[8, 0] = 1.0
        k[8] = 30
    return scores.to(DEVICE), k.to(DEVICE)


@pytest.mark.parametrize("digit_bits", [1, 2, 4])
@pytest.mark.parametrize("vocab_size", [2048, 3072])
@pytest.mark.parametrize("batch", [1, 37])
def test_kth_largest_equals_topk(monkeypatch, batch, vocab_size, digit_bits):
    from chorus.talker.models import select_kernel

    monkeypatch.setattr(select_kernel, "DIGIT_BITS", digit_bits)  # bits found per pass: any divisor of 32 serves
    generator = torch.Generator().manual_seed(batch * vocab_size)
    scores, k = _hard_rows(batch, vocab_size, generator)
    expected = scores.topk(FAST_TOP_K, dim=-1).values.gather(-1, (k - 1)[:, None])[:, 0]
    got = kth_largest(scores, k)
    assert torch.equal(got, expected)
    wide = torch.full((batch, vocab_size + 13), 99.0, device=DEVICE)
    wide[:, :vocab_size] = scores
    assert torch.equal(kth_largest(wide[:, :vocab_size], k), expected)  # rows of a wider buffer: the stride counts


def test_every_k_of_one_row():
    generator = torch.Generator().manual_seed(1)
    row = (torch.randn(1, 2048, generator=generator) * 2).bfloat16().float().expand(FAST_TOP_K, -1).contiguous()
    row[:, 5] = float("-inf")
    k = torch.arange(1, FAST_TOP_K + 1)
    expected = row.topk(FAST_TOP_K, dim=-1).values[0]
    assert torch.equal(kth_largest(row.to(DEVICE), k.to(DEVICE)).cpu(), expected)


def _rows(count: int, generator: torch.Generator) -> RowParams:
    return RowParams(
        do_sample=(torch.rand(count, generator=generator) < 0.8).to(DEVICE),
        temperature=(0.5 + torch.rand(count, generator=generator)).to(DEVICE),
        top_k=torch.randint(1, FAST_TOP_K + 1, (count,), generator=generator).to(DEVICE),
        top_p=torch.ones(count, device=DEVICE),
        seed=torch.randint(0, 2**40, (count,), generator=generator).to(DEVICE),
    )


@pytest.mark.parametrize("compiled", [False, True])
def test_warp_through_the_kernel_equals_warp_through_topk(monkeypatch, compiled):
    generator = torch.Generator().manual_seed(7)
    run_warp = torch.compile(warp, dynamic=True, fullgraph=True) if compiled else warp
    for batch, vocab_size in ((1, 2048), (37, 3072)):
        scores, _ = _hard_rows(batch, vocab_size, generator)
        params = _rows(batch, generator)
        # Compiled against compiled: Inductor's Triton division may round the temperature's quotient unlike eager.
        monkeypatch.setattr(sampling, "SELECT_KERNEL_DEVICES", ())
        expected = run_warp(scores, params, FAST_TOP_K)
        monkeypatch.setattr(sampling, "SELECT_KERNEL_DEVICES", (DEVICE,))
        assert torch.equal(run_warp(scores, params, FAST_TOP_K), expected)


@pytest.mark.parametrize(
    ("dtype", "digit_bits"), [(torch.float32, 2), (torch.bfloat16, 2), (torch.bfloat16, 1), (torch.bfloat16, 4)]
)
@pytest.mark.parametrize("vocab_size", [2048, 3072])
def test_draw_top_k_picks_what_sample_code_picks(monkeypatch, vocab_size, dtype, digit_bits):
    """Ties, -inf and +inf rows, greedy rows, seeds past 32 bits: the same ids as the PyTorch draw through topk
    (compiled on CUDA, where Inductor's Triton division is the kernel's; eager in the interpreter), and their rows
    of the embedding table. bf16 logits take the search among 16-bit keys of the logits, fp32 among 32-bit keys of
    the warped scores."""
    from chorus.talker.models import select_kernel

    monkeypatch.setattr(select_kernel, "DIGIT_BITS", digit_bits)
    generator = torch.Generator().manual_seed(vocab_size)
    scores, _ = _hard_rows(37, vocab_size, generator)
    logits = scores.to(dtype)
    params = _rows(37, generator)
    params.seed[:3] = torch.tensor([0, 2**32 + 7, 2**63 - 1])
    frame = torch.randint(0, 4000, (37,), generator=generator).to(DEVICE)
    monkeypatch.setattr(sampling, "SELECT_KERNEL_DEVICES", ())
    reference = torch.compile(sample_code, dynamic=True, fullgraph=True) if DEVICE == "cuda" else sample_code
    table = torch.randn(vocab_size, 40, generator=generator).to(DEVICE, torch.bfloat16)  # 40: a partial block
    for codebook in (1, 15):
        expected = reference(logits, params, frame, codebook, FAST_TOP_K)
        ids, embedded = draw_top_k(
            logits, params.do_sample, params.temperature, params.top_k, params.seed, frame, codebook, FAST_TOP_K,
            table,
        )  # fmt: skip
        assert torch.equal(ids, expected)
        assert torch.equal(embedded, table[expected])
    assert params.do_sample.any() and not params.do_sample.all()


def test_compiled_sampling_calls_the_kernel(monkeypatch):
    """`torch.compile(fullgraph=True, dynamic=True)` keeps the custom op as one call in the compiled code."""
    from torch._inductor.utils import run_and_get_code

    monkeypatch.setattr(sampling, "SELECT_KERNEL_DEVICES", (DEVICE,))
    generator = torch.Generator().manual_seed(3)
    scores, _ = _hard_rows(37, 2048, generator)
    params = _rows(37, generator)
    frame = torch.arange(37, device=DEVICE)
    table = torch.randn(2048, 16, device=DEVICE)
    compiled = torch.compile(sample_code_and_embed, dynamic=True, fullgraph=True)
    (ids, embedded), code = run_and_get_code(compiled, scores, params, frame, 3, table, FAST_TOP_K)
    assert any("chorus.draw_top_k" in source for source in code)
    monkeypatch.setattr(sampling, "SELECT_KERNEL_DEVICES", ())
    assert torch.equal(ids, sample_code(scores, params, frame, 3, FAST_TOP_K))
    assert torch.equal(embedded, table[ids])


@pytest.mark.gpu
def test_cuda_graph_replay_of_compiled_sampling_equals_eager(monkeypatch):
    """Captured in a CUDA graph, the compiled sampler (kernel included) follows new inputs written into its buffers
    and picks what the eager topk path picks."""
    from chorus.runtime.streams import capture_graph

    generator = torch.Generator().manual_seed(5)
    compiled = torch.compile(sample_code_and_embed, dynamic=True, fullgraph=True)
    scores, _ = _hard_rows(256, 2048, generator)
    params = _rows(256, generator)
    frame = torch.arange(256, device=DEVICE)
    table = torch.randn(2048, 1024, device=DEVICE, dtype=torch.bfloat16)
    graph, (ids, embedded) = capture_graph(lambda: compiled(scores, params, frame, 3, table, FAST_TOP_K))
    monkeypatch.setattr(sampling, "SELECT_KERNEL_DEVICES", ())
    for _ in range(3):
        scores.copy_(_hard_rows(256, 2048, generator)[0])
        params.top_k.copy_(torch.randint(1, FAST_TOP_K + 1, (256,), generator=generator))
        graph.replay()
        expected = sample_code(scores, params, frame, 3, FAST_TOP_K)
        assert torch.equal(ids, expected)
        assert torch.equal(embedded, table[expected])

"""Prefill padded to a (rows, length) bucket computes what the unpadded prefill computes for the real positions,
and writes the same cache entries there (CPU here; the CUDA graphs that replay it are covered by the GPU tests)."""

from __future__ import annotations

import torch

from chorus.talker.engine.prefill import PaddedPrefill, batches_by_length, prefill_bucket, row_buckets
from chorus.talker.loader import TINY_CONFIG, TINY_SEED, build_random


def test_buckets():
    assert prefill_bucket(1, 1) == (1, 64)
    assert prefill_bucket(3, 64) == (4, 64)
    assert prefill_bucket(16, 65) == (16, 128)
    assert prefill_bucket(16, 150) == (16, 192) and prefill_bucket(1, 257) == (1, 384)
    assert prefill_bucket(17, 10) is None
    assert prefill_bucket(2, 513) is None
    assert prefill_bucket(17, 10, max_rows=32) == (32, 64)  # the rows follow the most prompts a step prefills
    assert row_buckets(16) == (1, 2, 4, 8, 16) and row_buckets(24) == (1, 2, 4, 8, 16, 24)
    assert row_buckets(256)[-1] == 64 and prefill_bucket(65, 10, max_rows=256) is None  # beyond: an eager forward


def _positions(rows: int, length: int) -> int:
    return rows * length


def test_prompts_of_unlike_lengths_prefill_in_separate_batches_when_that_costs_less():
    lengths = [150, 27, 56, 27, 150, 56]
    # Four short prompts in (4, 64), two long in (2, 192): 256 + 384 positions, against 1536 for (8, 192).
    assert batches_by_length(lengths, _positions) == [[1, 3, 2, 5], [0, 4]]
    # A replay's fixed cost worth 1000 positions: one forward of (8, 192) is cheaper than two.
    assert batches_by_length(lengths, lambda rows, length: 1000 + rows * length) == [[1, 3, 2, 5, 0, 4]]
    # Merged they would need 8 rows, past the largest row bucket: never merged.
    assert batches_by_length(lengths, lambda rows, length: 1000 + rows * length, max_rows=4) == [[1, 3, 2, 5], [0, 4]]
    assert batches_by_length([10], _positions) == [[0]]
    # Three buckets: the 64s and 128s merge (300 + 4 · 128 ≤ 300 + 64 + 300 + 2 · 128), not with the 256s
    # (300 + 8 · 256 against 2 · (300 + 512)).
    cost = lambda rows, length: 300 + rows * length  # noqa: E731
    assert batches_by_length([100, 200, 30, 250, 120], cost) == [[2, 0, 4], [1, 3]]


def test_padded_prefill_matches_the_unpadded_forward():
    torch.manual_seed(0)
    stack = build_random(TINY_CONFIG, TINY_SEED).talker.model
    block = stack.config
    cache = torch.zeros(block.num_hidden_layers, 2, 4, block.num_key_value_heads, 256, block.head_dim)
    padded = PaddedPrefill(stack, cache, use_cuda_graphs=False)
    lengths = [70, 45, 3]  # → bucket (4 rows, 128 positions)
    embeds = torch.nn.utils.rnn.pad_sequence([torch.randn(n, block.hidden_size) for n in lengths], batch_first=True)
    longest = max(lengths)
    scratch = cache.new_zeros(
        block.num_hidden_layers, 2, len(lengths), block.num_key_value_heads, longest, block.head_dim
    )
    with torch.inference_mode():
        positions = torch.arange(longest).repeat(len(lengths), 1)
        expected = stack(embeds, positions, list(scratch), longest)
        hidden, written = padded.run(embeds)
    assert hidden.shape == expected.shape
    assert written.shape[:4] == scratch.shape[:4] and written.shape[4] == 128  # the bucket's whole blocks
    for row, length in enumerate(lengths):  # padded positions differ only past each row's prompt
        torch.testing.assert_close(hidden[row, :length], expected[row, :length], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(written[:, :, row, :, :length], scratch[:, :, row, :, :length], atol=1e-5, rtol=1e-5)


def test_beyond_the_largest_bucket_is_left_to_the_caller():
    stack = build_random(TINY_CONFIG, TINY_SEED).talker.model
    block = stack.config
    cache = torch.zeros(block.num_hidden_layers, 2, 1, block.num_key_value_heads, 1024, block.head_dim)
    with torch.inference_mode():
        assert PaddedPrefill(stack, cache, use_cuda_graphs=False).run(torch.zeros(1, 600, block.hidden_size)) is None

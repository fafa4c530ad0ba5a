"""The talker's prefill forward on CUDA: prompts padded to (rows, length) buckets, replayed as CUDA graphs.

An eager prefill launches a few dozen small kernels per layer, one Python call each; on a busy serving host that
cost ~50 ms of host time for one 0.6B prompt (1.8 ms of GPU work), all of it in the new request's time to first
audio and, since decoding waits meanwhile, in every running stream's next frame. A replay launches them at once.

Prompts are right-padded to their bucket: a padded position only writes cache entries past its row's prompt, which
that row's decode steps overwrite before anything attends to them. Eager and replayed prefills run the same padded
shapes, so they compute the same numbers; a batch or prompt beyond the largest bucket runs eagerly at its own size.
Every bucket works on views of one set of buffers sized for the largest: input embeddings, positions, and the
scratch cache the forward writes (the runner copies it into the slots' cache).

A batch's prompts are padded to its longest, so prompts of very different lengths prefill in separate batches
when two forwards cost less than one (`batches_by_length`): 27-position prompts in the (32, 64) bucket rather than
padded with 150-position ones into (32, 192), which takes three times as long (7.6 against 23.0 ms at 0.6B on an
H100). What a bucket's forward costs is timed once its graph is captured, a replay's fixed cost (hundreds of
kernels) included.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from chorus.runtime.buckets import power_of_two_sizes
from chorus.runtime.streams import capture_graph

# Whole KV blocks (`kv_blocks.BLOCK_SIZE`), as the runner stores them, each at most 1.5 times the one before: a
# prompt's padding is under a third of its bucket past the first.
LENGTH_BUCKETS = (64, 128, 192, 256, 384, 512)
MAX_PADDED_ROWS = 64  # its scratch cache holds 64 × 512 positions: 3.8 GB at 0.6B; a larger batch runs eagerly


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """The row buckets for at most `max_rows` prompts a step (MAX_PADDED_ROWS at most)."""
    return power_of_two_sizes(min(max_rows, MAX_PADDED_ROWS))


def buckets_largest_first(max_rows: int) -> list[tuple[int, int]]:
    """Every (rows, length) bucket, the largest first: captured in this order, the others reuse its pool memory."""
    return [(rows, length) for rows in reversed(row_buckets(max_rows)) for length in reversed(LENGTH_BUCKETS)]


def length_bucket(length: int) -> int | None:
    """The smallest length bucket holding a prompt, or None past the largest."""
    return next((bucket for bucket in LENGTH_BUCKETS if bucket >= length), None)


def prefill_bucket(num_rows: int, length: int, max_rows: int = 16) -> tuple[int, int] | None:
    """The smallest (rows, length) bucket holding a batch, or None past the largest."""
    rows = next((bucket for bucket in row_buckets(max_rows) if bucket >= num_rows), None)
    padded = length_bucket(length)
    return None if rows is None or padded is None else (rows, padded)


def batches_by_length(lengths: list[int], cost: Callable[[int, int], float], max_rows: int = 16) -> list[list[int]]:
    """The indices of prompts of these `lengths` (each fitting a length bucket) in prefill batches: one batch per
    length bucket, shortest first, each merged into the one before while a forward of the two together costs no
    more than two forwards (`cost(rows, length)` of a bucket) and a bucket holds them."""

    def batch_cost(batch: list[int]) -> float:
        bucket = prefill_bucket(len(batch), max(lengths[index] for index in batch), max_rows)
        return float("inf") if bucket is None else cost(*bucket)

    by_length = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[list[int]] = []
    for _, group in itertools.groupby(by_length, key=lambda index: length_bucket(lengths[index])):
        group = list(group)
        if batches and batch_cost(batches[-1] + group) <= batch_cost(batches[-1]) + batch_cost(group):
            batches[-1] += group
        else:
            batches.append(group)
    return batches


class PaddedPrefill:
    def __init__(self, stack, cache: torch.Tensor, use_cuda_graphs: bool, max_rows: int = 16) -> None:
        """`stack`: the talker's decoder stack; `cache`: the runner's slot cache (for shapes and dtype); `max_rows`:
        the most prompts prefilled together."""
        num_layers, _, _, num_kv_heads, _, head_dim = cache.shape
        max_length = LENGTH_BUCKETS[-1]
        self.max_rows = max_rows = row_buckets(max_rows)[-1]
        self.stack = stack
        self.embeds = cache.new_zeros(max_rows, max_length, stack.config.hidden_size)
        self.positions = torch.arange(max_length, device=cache.device).repeat(max_rows, 1)
        self.scratch = cache.new_zeros(num_layers, 2, max_rows, num_kv_heads, max_length, head_dim)
        self.use_cuda_graphs = use_cuda_graphs
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None
        self.replay_ms: dict[tuple[int, int], float] = {}  # each captured bucket's forward, timed (`capture_all`)

    def cost(self, rows: int, length: int) -> float:
        """What a bucket's forward costs: its replay's time once timed (ms), else its positions (without a GPU to
        time, all that is known)."""
        return self.replay_ms[(rows, length)] if self.replay_ms else rows * length

    def batches(self, lengths: list[int]) -> list[list[int]]:
        """`batches_by_length` with this prefill's costs and rows."""
        return batches_by_length(lengths, self.cost, self.max_rows)

    def run(self, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Hidden states `[R, L, H]` of padded prompts `embeds [R, L, H]`, and the scratch cache they wrote
        `[layers, 2, R, kv_heads, L', D]` up to the bucket's length L' (views, valid until the next prefill); None
        when no bucket holds them."""
        num_rows, length, _ = embeds.shape
        bucket = prefill_bucket(num_rows, length, self.max_rows)
        if bucket is None:
            return None
        rows, padded = bucket
        self.embeds[:rows, :padded].zero_()
        self.embeds[:num_rows, :length].copy_(embeds)
        if self.use_cuda_graphs:
            if bucket not in self.graphs:
                self.capture(*bucket)
            graph, hidden = self.graphs[bucket]
            graph.replay()
        else:
            hidden = self._forward(rows, padded)
        return hidden[:num_rows, :length], self.scratch[:, :, :num_rows, :, :padded]

    def _forward(self, rows: int, length: int) -> torch.Tensor:
        scratch = self.scratch[:, :, :rows, :, :length]
        return self.stack(self.embeds[:rows, :length], self.positions[:rows, :length], list(scratch), length)

    @torch.no_grad()
    def capture(self, rows: int, length: int) -> None:
        graph, hidden = capture_graph(lambda: self._forward(rows, length), self.pool)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[(rows, length)] = (graph, hidden)

    def capture_all(self) -> None:
        """Every bucket (`buckets_largest_first`); then each replay timed."""
        for bucket in buckets_largest_first(self.max_rows):
            if bucket not in self.graphs:
                self.capture(*bucket)
        self.replay_ms = {bucket: _replay_ms(graph) for bucket, (graph, _) in self.graphs.items()}


def _replay_ms(graph: torch.cuda.CUDAGraph, num_replays: int = 3) -> float:
    """The fastest of a few replays of a warmed-up graph, in ms."""
    times = []
    for _ in range(num_replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return min(times)

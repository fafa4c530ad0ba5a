"""The whole prefill of plain prompts (text and codec ids only: named and designed voices, not resumed) as one CUDA
graph per (rows, length) bucket: ids in, each slot's decode state out.

Under load a prefill costs the engine thread its PyTorch calls more than its GPU work: every call gives up the GIL,
which the speech process's event loop and vocoder thread then hold for a while. At 256 streams a prefill batch of
26 prompts made ~180 calls (the ids' upload, the embeddings, the forward's replay, the copy into the KV blocks, the
sampler, the state writes) and took 38 ms of the engine thread, 11 of them on its CPU (docs/performance-log.md,
prefill phases). Here the host packs every number a batch needs into one pinned buffer; one copy and one replay do
the rest.

A replay computes what `TalkerRunner.prefill` computes for the same prompts, the embeddings looked up for every
padded position at once. A padded position has no ids and embeds to zeros, as the padded prefill pads; a padded
row (past the batch's) writes its state into the runner's scratch slot and its cache entries into the spare KV
block, which nothing reads.
"""

from __future__ import annotations

import numpy as np
import torch

from chorus.runtime.streams import capture_graph
from chorus.talker.engine.host_mirror import HostMirror
from chorus.talker.engine.kv_blocks import BLOCK_SIZE
from chorus.talker.engine.prefill import LENGTH_BUCKETS, buckets_largest_first, prefill_bucket
from chorus.talker.prompt import NONE, Part, Prompt


def packed_sizes(rows: int, length: int) -> list[int]:
    """A (rows, length) bucket's packed inputs, in order: text ids and codec ids `[rows, length]` (NONE where a
    position has none), slots and last prompt positions `[rows]`, KV block targets `[rows, length / BLOCK_SIZE]`."""
    return [rows * length, rows * length, rows, rows, rows * (length // BLOCK_SIZE)]


def _embed_where_given(embed, ids: torch.Tensor) -> torch.Tensor:
    """`embed(ids)` `[N, H]`, zeros where an id is NONE."""
    return torch.where((ids != NONE)[:, None], embed(ids.clamp(min=0)), 0)


class PlainPrefill:
    def __init__(self, runner) -> None:
        """`runner`: a `TalkerRunner` with a padded prefill, whose positions, scratch cache and buckets this uses."""
        self.runner = runner
        self.padded = runner.padded_prefill
        size = sum(packed_sizes(self.padded.max_rows, LENGTH_BUCKETS[-1]))
        self.inputs = torch.zeros(size, dtype=torch.long, device=runner.device)
        self._packed = HostMirror(self.inputs)  # a batch's bucket fills a prefix of it
        self.row_index = torch.arange(self.padded.max_rows, device=runner.device)
        # Frames each row made before its prompt: none, for a plain (fresh) prompt.
        self.no_frames = torch.zeros(self.padded.max_rows, dtype=torch.long, device=runner.device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def fits(self, num_rows: int, longest: int) -> bool:
        return prefill_bucket(num_rows, longest, self.padded.max_rows) is not None

    @torch.no_grad()
    def run(self, slots: list[int], prompts: list[Prompt]) -> None:
        """Prefill plain `prompts` (which `fits`) into `slots`, each holding its prompt's KV blocks, as
        `TalkerRunner.prefill` would: each row's next codebook-0 id sampled, never EOS."""
        lengths = [prompt.num_positions for prompt in prompts]
        rows, length = prefill_bucket(len(prompts), max(lengths), self.padded.max_rows)
        self._upload(slots, prompts, lengths, rows, length)
        if not self.padded.use_cuda_graphs:
            self.compute(rows, length)
            return
        if (rows, length) not in self.graphs:
            self.capture(rows, length)
        self.graphs[(rows, length)].replay()

    def _upload(self, slots: list[int], prompts: list[Prompt], lengths: list[int], rows: int, length: int) -> None:
        """Pack the batch's inputs, padded to the bucket, and copy them to the device in one copy."""
        sizes = packed_sizes(rows, length)
        packed = self._packed.host[: sum(sizes)]
        text_ids, codec_ids, slot_of, last_index, targets = np.split(packed, np.cumsum(sizes)[:-1])
        text_ids, codec_ids = text_ids.reshape(rows, length), codec_ids.reshape(rows, length)
        text_ids.fill(NONE)
        codec_ids.fill(NONE)
        slot_of.fill(self.runner.scratch_slot)
        last_index.fill(0)
        for row, (slot, prompt, count) in enumerate(zip(slots, prompts, lengths, strict=True)):
            text_ids[row, :count] = prompt.positions[:, Part.TEXT_ID]
            codec_ids[row, :count] = prompt.positions[:, Part.CODEC_ID]
            slot_of[row], last_index[row] = slot, count - 1
        self.runner.kv_blocks.prompt_targets(slots, lengths, targets.reshape(rows, -1))
        self._packed.mark_changed()
        self._packed.upload(len(packed))

    def compute(self, rows: int, length: int) -> None:
        """The bucket's prefill from the packed inputs on the device: static shapes, what a graph captures."""
        runner, talker = self.runner, self.runner.model.talker
        sizes = packed_sizes(rows, length)
        text_ids, codec_ids, slots, last_index, targets = self.inputs[: sum(sizes)].split(sizes)
        # Summed as `embed_prompts` sums them (text, then codec) and as the padded prefill pads (zeros).
        embeds = _embed_where_given(talker.embed_text, text_ids) + _embed_where_given(talker.embed_codec, codec_ids)
        scratch = self.padded.scratch[:, :, :rows, :, :length]
        positions = self.padded.positions[:rows, :length]
        hidden = talker.model(embeds.view(rows, length, -1), positions, list(scratch), length)
        runner.store_prompts(scratch, targets)
        runner.generated_mask.index_fill_(0, slots, False)
        runner.start_rows(slots, hidden[self.row_index[:rows], last_index], last_index, self.no_frames[:rows])

    @torch.no_grad()
    def capture(self, rows: int, length: int) -> None:
        """Capture the bucket's graph; its warm-up runs compute on the packed inputs there are, so those must be
        this bucket's (a batch's, or `capture_all`'s empty one)."""
        graph, _ = capture_graph(lambda: self.compute(rows, length), self.padded.pool)
        if self.padded.pool is None:
            self.padded.pool = graph.pool()
        self.graphs[(rows, length)] = graph

    @torch.no_grad()
    def capture_all(self) -> None:
        """Every bucket (`buckets_largest_first`), each warmed up on an empty batch (every row padded)."""
        for bucket in buckets_largest_first(self.padded.max_rows):
            if bucket not in self.graphs:
                self._upload([], [], [], *bucket)
                self.capture(*bucket)

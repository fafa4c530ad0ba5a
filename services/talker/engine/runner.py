"""The only device code of the talker: the KV cache, prefill, the one-frame decode step, CUDA graphs.

State lives on the device in per-slot buffers, so a decode step needs from the host only which rows advance and
each row's trailing-text id, and hands back the finished frames and next codebook-0 ids (the one sync per step).
A decode step covers slot rows `[0, n)`: the scheduler packs live requests into the lowest free slots, and rows
that must not advance (free, paused, waiting for text) compute but keep their state. The talker's KV cache is a
pool of blocks that slots take as they grow (`KVBlocks`); the code predictor's, never longer than a frame's 16
codes, is one fixed block per slot.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import torch

from chorus.talker.engine.host_mirror import HostMirror
from chorus.talker.engine.kv_blocks import BLOCK_SIZE, SPARE_BLOCK, KVBlocks, blocks_for
from chorus.talker.engine.plain_prefill import PlainPrefill
from chorus.talker.engine.prefill import LENGTH_BUCKETS, PaddedPrefill
from chorus.talker.models.qwen3_layers import compile_for_decode
from chorus.talker.models.qwen3_tts_talker import Qwen3TTSModel
from chorus.talker.models.speaker_encoder import log_mel_spectrogram
from chorus.talker.prompt import embed_prompts
from chorus.talker.sampling import FAST_TOP_K, RowParams, SamplingParams, sample_code0, sample_code_and_embed

LENGTH_BUCKET = 256  # attended-length bucket of the PyTorch attention path
# Longest run of queries an eager prefill forward attends at once: its attention scores take rows × heads × chunk ×
# length, where a whole 4 k-position prompt (a request resumed deep into its audio) would take length².
PREFILL_CHUNK_POSITIONS = LENGTH_BUCKETS[-1]
MIN_FRAMES = 2  # the reference bans EOS until two codebook-0 ids were generated
NEVER = 1 << 62
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)  # a step costs ~12 µs a row past 64


def kv_bytes_per_position(model: Qwen3TTSModel, dtype: torch.dtype) -> int:
    """Talker K+V bytes for one cached position of one stream."""
    block = model.config.talker
    return 2 * block.num_hidden_layers * block.num_key_value_heads * block.head_dim * torch.finfo(dtype).bits // 8


def positions_for_memory(free_bytes: int, utilization: float, bytes_per_position: int) -> int:
    """How many KV positions, in whole blocks, fit in `utilization` of `free_bytes`."""
    return max(0, int(free_bytes * utilization) // bytes_per_position) // BLOCK_SIZE * BLOCK_SIZE


def batch_bucket(num_rows: int, max_rows: int) -> int:
    """The smallest bucket ≥ `num_rows` (capped at `max_rows`), so graphs exist for few distinct sizes."""
    for bucket in BATCH_BUCKETS:
        if bucket >= num_rows:
            return min(bucket, max_rows)
    return max_rows


class _SlotParams:
    """Each slot's sampling parameters and EOS rule, as one device table per dtype (rows are fields, columns
    slots), each mirrored on the host, so a prefill batch writes all of them in three uploads."""

    def __init__(self, num_slots: int, device: torch.device) -> None:
        self.flags = torch.zeros(2, num_slots, dtype=torch.bool, device=device)
        self.floats = torch.ones(5, num_slots, device=device)
        self.longs = torch.zeros(5, num_slots, dtype=torch.long, device=device)
        flags, floats, longs = self.flags, self.floats, self.longs
        self.talker = RowParams(flags[0], floats[0], longs[0], floats[1], longs[1])
        self.predictor = RowParams(flags[1], floats[2], longs[2], floats[3], longs[3])
        self.repetition_penalty = floats[4]
        self.min_frames = longs[4]  # frames before EOS may be sampled
        self.min_frames.fill_(MIN_FRAMES)
        self.mirrors = [HostMirror(table) for table in (flags, floats, longs)]

    @staticmethod
    def columns(samplings: list[SamplingParams], seeds: list[int], ignore_eos: list[bool]) -> tuple[list, list, list]:
        """The (flags, floats, longs) columns of these requests, laid out as the tables' rows."""
        flags, floats, longs = [], [], []
        for prefix in ("", "subtalker_"):
            do_sample, temperature, top_p, top_k = (
                [getattr(s, prefix + name) for s in samplings]
                for name in ("do_sample", "temperature", "top_p", "top_k")
            )
            flags.append(do_sample)
            # a greedy row's temperature is never applied; 1.0 keeps its unused division finite
            floats += [[t if sample else 1.0 for t, sample in zip(temperature, do_sample, strict=True)], top_p]
            longs += [top_k, seeds]
        floats.append([s.repetition_penalty for s in samplings])
        longs.append([NEVER if flag else MIN_FRAMES for flag in ignore_eos])
        return flags, floats, longs


def _rows(params: RowParams, rows: slice) -> RowParams:
    return RowParams(*(getattr(params, field.name)[rows] for field in dataclasses.fields(RowParams)))


def advance_rows(
    active: torch.Tensor,
    hidden: torch.Tensor,
    code0: torch.Tensor,
    out_code0: torch.Tensor,
    last_hidden: torch.Tensor,
    next_code0: torch.Tensor,
    position: torch.Tensor,
    num_generated: torch.Tensor,
    generated_mask: torch.Tensor,
) -> None:
    """Rows one frame on, in place: the sampled `code0 [B]` into `out_code0`; for the rows whose `active [B]` flag is
    set, the talker's `hidden [B, H]` and `code0` become the next frame's inputs, the position and frame count step,
    and `code0` joins the ids the repetition penalty sees."""
    active = active.bool()
    step = active.long()
    out_code0.copy_(code0)
    last_hidden.copy_(torch.where(active[:, None], hidden, last_hidden))
    next_code0.copy_(torch.where(active, code0, next_code0))
    position += step
    num_generated += step
    seen = generated_mask.scatter(1, code0[:, None], True)
    generated_mask.copy_(torch.where(active[:, None], seen, generated_mask))


class TalkerRunner:
    """Owns the model, the KV caches and per-slot decode state on `device`."""

    def __init__(
        self,
        model: Qwen3TTSModel,
        num_slots: int,
        max_positions: int,
        use_cuda_graphs: bool = False,
        compile_step: bool = False,
        kv_cache_positions: int = 0,
        few_rows_matmul: bool = True,
        max_prefill_rows: int = 16,
        pad_prefills: bool | None = None,
    ):
        """`kv_cache_positions`: the talker's KV pool, shared by all slots (0: every slot's `max_positions`).
        `few_rows_matmul`: with `compile_step`, decode steps of at most 2 rows take `few_rows_matmul` (CUDA).
        `max_prefill_rows`: the most prompts prefilled together (padded prefill buckets up to it). `pad_prefills`:
        prefills padded to buckets, plain prompts' from their ids (None: on CUDA, where graphs replay them)."""
        self.model = model
        self.config = model.config
        weight = model.talker.codec_head.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.num_slots, self.max_positions = num_slots, max_positions
        talker, predictor = self.config.talker, self.config.code_predictor
        num_blocks = 1 + blocks_for(kv_cache_positions or num_slots * blocks_for(max_positions) * BLOCK_SIZE)
        self.kv_blocks = KVBlocks(num_slots, max_positions, num_blocks, self.device)
        # Zeros: every entry stays finite, so the PyTorch path's masked positions (weight 0) add exactly 0.
        self.talker_cache = torch.zeros(
            talker.num_hidden_layers,
            2,
            num_blocks,
            talker.num_key_value_heads,
            BLOCK_SIZE,
            talker.head_dim,
            device=self.device,
            dtype=self.dtype,
        )
        self.predictor_cache = torch.zeros(
            predictor.num_hidden_layers,
            2,
            num_slots,
            predictor.num_key_value_heads,
            self.config.num_code_groups,
            predictor.head_dim,
            device=self.device,
            dtype=self.dtype,
        )
        # Read as a paged cache by the decode kernels: one block of 16 positions per slot, slot i's block i.
        self.predictor_table = torch.arange(num_slots, dtype=torch.int32, device=self.device)[:, None]
        # The code predictor's positions per slot: 0 and 1 for its first forward, c + 1 for codebook c's. Kept, not
        # made each frame: a captured graph would replay 16 fills for them.
        positions = torch.arange(self.config.num_code_groups + 1, device=self.device).repeat(num_slots, 1)
        self.predictor_positions = positions[:, :2].contiguous(), positions.T[:, :, None].contiguous()
        device, vocab = self.device, self.config.codec_vocab_size
        # Per-slot state, plus a scratch slot that the padded rows of a plain prefill write (`PlainPrefill`): no
        # decode step covers it.
        self.scratch_slot = num_slots
        state_rows = num_slots + 1
        self.last_hidden = torch.zeros(state_rows, talker.hidden_size, device=device, dtype=self.dtype)
        self.next_code0 = torch.zeros(state_rows, dtype=torch.long, device=device)
        self.position = torch.zeros(state_rows, dtype=torch.long, device=device)
        self.num_generated = torch.zeros(state_rows, dtype=torch.long, device=device)
        self.generated_mask = torch.zeros(state_rows, vocab, dtype=torch.bool, device=device)
        self._true = torch.ones((), dtype=torch.bool, device=device)  # a value to index_put_ without a host copy
        self.params = _SlotParams(state_rows, device)
        # Slots whose request needs the sorting sampler (top-p, or top-k off or past FAST_TOP_K): a step with any of
        # them active runs the graph that sorts; every other step selects (`sampling.warp`).
        self._sorting_slots: set[int] = set()
        # Step inputs and outputs: static buffers, so a captured graph reads and writes the same memory. The inputs
        # (per slot: an active flag, the text id to add) are one buffer, for one host-to-device copy per step.
        self.step_inputs = torch.zeros(2, num_slots, dtype=torch.long, device=device)
        self.active, self.text_ids = self.step_inputs
        # Per slot: the frame's 16 codes, and the next codebook-0 id. Two buffers, copied to the host as each is
        # ready: the frames once the code predictor is done, before the talker's own forward (see `launch`).
        self.out_frames = torch.zeros(num_slots, self.config.num_code_groups, dtype=torch.long, device=device)
        self.out_code0 = torch.zeros(num_slots, dtype=torch.long, device=device)
        # Host staging, two of each: step N+1 is launched before step N's output is read (see `launch`).
        pinned = device.type == "cuda"
        self._host_inputs = [torch.zeros(2, num_slots, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._host_frames = [torch.zeros_like(self.out_frames, device="cpu", pin_memory=pinned) for _ in range(2)]
        self._host_code0 = [torch.zeros_like(self.out_code0, device="cpu", pin_memory=pinned) for _ in range(2)]
        # NumPy views of the same memory: staging through them makes no PyTorch call (see `launch`).
        self._staged_inputs = [buffer.numpy() for buffer in self._host_inputs]
        self._staged_frames = [buffer.numpy() for buffer in self._host_frames]
        self._staged_code0 = [buffer.numpy() for buffer in self._host_code0]
        self._events = [(torch.cuda.Event(), torch.cuda.Event()) for _ in range(2)] if pinned else None
        self._launches = 0
        self._sample_code0, self._sample_code_and_embed = sample_code0, sample_code_and_embed
        self._advance_rows = advance_rows
        if compile_step and self.device.type == "cuda":
            self._compile(few_rows_matmul)
        # The Triton decode kernels attend only the positions each row has written: one length fits every step,
        # so there is one graph per batch bucket. The PyTorch path attends a length bucket ≥ every position.
        uses_kernels = model.talker.model.decode_kernels is not None
        self.length_bucket = max_positions if uses_kernels else LENGTH_BUCKET
        self.graphs = None
        if use_cuda_graphs and self.device.type == "cuda":
            from chorus.talker.engine.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self)
        self.padded_prefill = self.plain_prefill = None
        if self.device.type == "cuda" if pad_prefills is None else pad_prefills:
            self.padded_prefill = PaddedPrefill(
                model.talker.model, self.talker_cache, self.graphs is not None, max_prefill_rows
            )
            self.plain_prefill = PlainPrefill(self)

    def _compile(self, few_rows_matmul: bool) -> None:
        # Each compiled function is specialised per shape class (batch 1 or more, 1 or 2 tokens, prefill) and
        # codebook index, so allow more entries than the default before dynamo falls back to eager. The engine runs
        # under no_grad, not inference_mode: compiled code is also specialised on its inputs' dispatch keys, which
        # differ between tensors made in inference mode and the engine's buffers: mixing the two compiled shape
        # classes twice (48 graphs and a warm-up of 183–207 s at 0.6B on H200s, against 42 and 141 s;
        # bench/warmup_probe.py).
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        talker = self.model.talker
        talker.model.optimize_for_decode(few_rows_matmul)
        talker.code_predictor.model.optimize_for_decode(few_rows_matmul)
        # A frame's 16 embedding lookups as one gather from one table, and their sum, compiled (eager: 18 launches).
        talker.fuse_frame_embeddings()
        talker.embed_frame = compile_for_decode(talker.embed_frame)
        self._sample_code0 = compile_for_decode(sample_code0)
        self._sample_code_and_embed = compile_for_decode(sample_code_and_embed)
        self._advance_rows = compile_for_decode(advance_rows)  # 3 kernels, not 11

    def warmup(self, capture_positions: int | None = None) -> None:
        """Before the service reports SERVING: run prefills of one and of several rows (compiling their shape
        classes now rather than on the first requests, which would wait seconds), then capture decode graphs for
        every batch bucket (largest first, so later ones reuse its pool memory) and every attended length up to
        `capture_positions` (None: `max_positions`), and prefill graphs for every bucket. A longer length is
        captured when a step first needs it, pausing the decode loop once. The slots used are free again
        afterwards."""
        hidden_size = self.config.talker.hidden_size
        for num_rows, num_positions in ((1, 24), (min(2, self.num_slots, self.kv_blocks.num_free), 31)):
            num_positions = min(num_positions, self.max_positions - 1)
            embeds = torch.zeros(num_rows, num_positions, hidden_size, device=self.device)
            for row in range(num_rows):
                self.kv_blocks.grow(row, num_positions)
            self.prefill(list(range(num_rows)), embeds, [num_positions - row for row in range(num_rows)])
            for row in range(num_rows):
                self.kv_blocks.release(row)
        if self.padded_prefill is not None:
            self._compile_unpadded_prefill()
        if self.graphs is None:
            return
        self.padded_prefill.capture_all()
        self.plain_prefill.capture_all()
        buckets = sorted({batch_bucket(n, self.num_slots) for n in range(1, self.num_slots + 1)}, reverse=True)
        capture_positions = min(capture_positions or self.max_positions, self.max_positions)
        for num_rows in buckets:
            for index in range(-(-capture_positions // self.length_bucket)):
                attended_length = min(self.max_positions, (index + 1) * self.length_bucket)
                if (num_rows, attended_length, FAST_TOP_K) not in self.graphs.graphs:
                    self.graphs.capture(num_rows, attended_length, FAST_TOP_K)
        # The sorting sampler's graphs are captured when a step first needs them; capturing the two smallest now
        # compiles its code for both shape classes (batch 1 and more), so that first capture does not compile.
        shortest = min(self.max_positions, self.length_bucket)
        for num_rows in buckets[-2:]:
            if (num_rows, shortest, 0) not in self.graphs.graphs:
                self.graphs.capture(num_rows, shortest, 0)

    @torch.no_grad()
    def _compile_unpadded_prefill(self) -> None:
        """Compile now what a prompt past the padded buckets runs (a request resumed deep into its audio): its later
        chunks attend more positions than they feed, a shape class of their own, which would otherwise compile
        when such a request first comes, pausing every stream for seconds. The numbers are thrown away."""
        num_layers, _, _, num_kv_heads, _, head_dim = self.talker_cache.shape
        for num_rows in (1, 2):
            embeds = torch.zeros(num_rows, 8, self.config.talker.hidden_size, device=self.device, dtype=self.dtype)
            positions = torch.arange(8, 16, device=self.device).repeat(num_rows, 1)
            scratch = self.talker_cache.new_zeros(num_layers, 2, num_rows, num_kv_heads, 16, head_dim)
            self.model.talker.model(embeds, positions, list(scratch), 16)

    def _cache_views(self, cache: torch.Tensor, rows: slice) -> list[torch.Tensor]:
        return [layer[:, rows] for layer in cache]

    def set_params(
        self, slots: list[int], samplings: list[SamplingParams], seeds: list[int], ignore_eos: list[bool]
    ) -> None:
        """Per-slot sampling state of the requests about to be prefilled into `slots`."""
        for slot, sampling in zip(slots, samplings, strict=True):
            if sampling.selects_top_k():
                self._sorting_slots.discard(slot)
            else:
                self._sorting_slots.add(slot)
        columns = _SlotParams.columns(samplings, seeds, ignore_eos)
        for mirror, values in zip(self.params.mirrors, columns, strict=True):
            mirror.host[:, slots] = values
            mirror.mark_changed()
            mirror.upload()

    def _upload(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """`values` as a device tensor, without waiting for the stream: a blocking copy would first wait for the
        decode step in flight, then leave the GPU idle while the host prepares the next launch."""
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def _pick_code0(self, logits, rows: slice | torch.Tensor, top_k_bound: int = 0) -> torch.Tensor:
        ids = self.config.codec_ids
        return self._sample_code0(
            logits,
            self.generated_mask[rows],
            self.num_generated[rows],
            self.params.repetition_penalty[rows],
            self.params.min_frames[rows],
            _rows(self.params.talker, rows),
            ids.eos,
            self.config.first_control_id,
            top_k_bound,
        )

    @torch.no_grad()
    def speaker_vector(self, audio: torch.Tensor) -> torch.Tensor:
        """x-vector `[H]` of 24 kHz mono `audio [samples]` (Base checkpoints)."""
        assert self.model.speaker_encoder is not None, "validated by the prompt builder"
        mels = log_mel_spectrogram(audio.to(self.device, torch.float32)[None])
        return self.model.speaker_encoder(mels.to(self.dtype))[0]

    @torch.no_grad()
    def embed_prompts(self, prompts, voices) -> tuple[torch.Tensor, list[int]]:
        return embed_prompts(self.model.talker, prompts, voices)

    @torch.no_grad()
    def prefill(
        self,
        slots: list[int],
        embeds: torch.Tensor,
        lengths: list[int],
        prefix_code0s: list[torch.Tensor | None] | None = None,
    ) -> None:
        """Run prompts `embeds [R, L, H]` (row i right-padded past `lengths[i]`) into `slots[i]` in one forward
        and sample each row's next codebook-0 id.

        A fresh row (`prefix_code0s[i]` None, or no `prefix_code0s`) samples frame 0's id, never EOS. A resumed row
        (`prefix_code0s[i]`: the codebook-0 ids of its N prefix frames, whose positions end its prompt) leaves the
        slot as the decode step of frame N-1 would have: penalty mask over those ids, frame N's id sampled as that
        step samples it (frame index N, so with the same draws; EOS allowed from the minimum on).

        A padded position writes cache entries past its row's prompt, which that row's decode steps overwrite
        before anything attends to them. Each slot must hold the KV blocks of its prompt's positions.
        """
        num_rows, longest, _ = embeds.shape
        assert longest <= self.max_positions, "prompt longer than the cache; the engine checks this"
        prefix_code0s = prefix_code0s or [None] * num_rows
        num_prefix = [0 if codes is None else len(codes) for codes in prefix_code0s]
        embeds = embeds.to(self.dtype)
        padded = self.padded_prefill.run(embeds) if self.padded_prefill is not None else None
        if padded is not None:
            hidden, scratch = padded
        else:
            positions = torch.arange(longest, device=self.device).repeat(num_rows, 1)
            num_layers, _, _, num_kv_heads, _, head_dim = self.talker_cache.shape
            whole_blocks = blocks_for(longest) * BLOCK_SIZE  # zeros past `longest`: stored, never attended
            scratch = self.talker_cache.new_zeros(num_layers, 2, num_rows, num_kv_heads, whole_blocks, head_dim)
            # Equal chunks, each attending the cache its predecessors wrote (none as short as a decode step's input).
            num_chunks = -(-longest // PREFILL_CHUNK_POSITIONS)
            edges = [longest * chunk // num_chunks for chunk in range(num_chunks + 1)]
            stack = self.model.talker.model
            hidden = torch.cat(
                [
                    stack(embeds[:, start:end], positions[:, start:end], list(scratch), end)
                    for start, end in itertools.pairwise(edges)
                ],
                dim=1,
            )
        targets = np.empty((num_rows, scratch.shape[4] // BLOCK_SIZE), dtype=np.int64)
        self.kv_blocks.prompt_targets(slots, lengths, targets)
        uploaded = self._upload(slots + lengths + num_prefix + targets.ravel().tolist(), torch.long)
        index, last_index, num_generated = uploaded[: 3 * num_rows].view(3, num_rows)
        last_index = last_index - 1
        self.store_prompts(scratch, uploaded[3 * num_rows :])
        last_hidden = hidden[torch.arange(num_rows, device=self.device), last_index]
        # No `mask[index] = False` here: an indexed assignment of a Python scalar copies the scalar to the device
        # with a blocking copy, which waits for the decode step in flight (a tenth of the engine thread's time at
        # 256 streams, the GPU idle behind it). index_fill_ takes the scalar as a kernel argument.
        self.generated_mask.index_fill_(0, index, False)
        if any(num_prefix):
            rows = [slot for slot, count in zip(slots, num_prefix, strict=True) for _ in range(count)]
            code0s = torch.cat([codes for codes in prefix_code0s if codes is not None])
            seen = torch.cat((torch.tensor(rows, dtype=torch.long), code0s.long())).to(self.device, non_blocking=True)
            self.generated_mask.index_put_((seen[: len(rows)], seen[len(rows) :]), self._true)
        self.start_rows(index, last_hidden, last_index, num_generated)

    def store_prompts(self, scratch: torch.Tensor, targets: torch.Tensor) -> None:
        """Copy a prefill's keys and values from `scratch [layers, 2, rows, kv_heads, L, D]` (L a whole number of
        blocks) into the pool, in one copy: row i's j-th block to `targets [rows × L / BLOCK_SIZE]` entry
        `i × L / BLOCK_SIZE + j` (`KVBlocks.prompt_targets`)."""
        num_blocks = scratch.shape[4] // BLOCK_SIZE
        by_block = scratch.unflatten(4, (num_blocks, BLOCK_SIZE))
        by_block = by_block.transpose(3, 4).flatten(2, 3)  # [layers, 2, rows × blocks, kv_heads, BLOCK_SIZE, D]
        self.talker_cache.index_copy_(2, targets, by_block)

    def start_rows(
        self, index: torch.Tensor, last_hidden: torch.Tensor, last_index: torch.Tensor, num_generated: torch.Tensor
    ) -> None:
        """Slots `index [R]` ready to decode after their prompts: each row's talker state `last_hidden [R, H]` at its
        last prompt position `last_index [R]`, after `num_generated [R]` frames (whose ids the caller put in the
        penalty mask); samples each row's next codebook-0 id."""
        self.num_generated[index] = num_generated
        code0 = self._pick_code0(self.model.talker.codec_head(last_hidden), index)
        self.last_hidden[index] = last_hidden
        self.next_code0[index] = code0
        self.position[index] = last_index + 1
        self.num_generated[index] = num_generated + 1
        self.generated_mask.index_put_((index, code0), self._true)

    def next_code0s(self, slots: list[int]) -> list[int]:
        """The codebook-0 ids sampled for `slots`' next frames; waits for the device."""
        return self.next_code0[self._upload(slots, torch.long)].tolist()

    def _predict_frame(self, num_rows: int, top_k_bound: int) -> torch.Tensor:
        """Codebooks 1..15 for rows `[0, num_rows)` → whole frames `[n, 16]`."""
        rows = slice(0, num_rows)
        talker, predictor = self.model.talker, self.model.talker.code_predictor
        kv_caches = self._cache_views(self.predictor_cache, rows)
        params = _rows(self.params.predictor, rows)
        frame_index = self.num_generated[rows] - 1
        code0 = self.next_code0[rows]
        inputs = torch.stack((self.last_hidden[rows], talker.embed_codec(code0)), dim=1)
        first_positions, codebook_positions = self.predictor_positions
        positions = first_positions[rows]
        codes = [code0]
        table = self.predictor_table[rows]
        for codebook in range(1, self.config.num_code_groups):
            logits = predictor(inputs, positions, kv_caches, codebook - 1, table)
            embedding = predictor.embedding(codebook)  # the last codebook's too: one code path, 2 KB a row
            code, embedded = self._sample_code_and_embed(logits, params, frame_index, codebook, embedding, top_k_bound)
            codes.append(code)
            inputs = embedded[:, None]
            positions = codebook_positions[codebook + 1, rows]
        return torch.stack(codes, dim=1)

    def decode_compute(self, num_rows: int, attended_length: int, top_k_bound: int = 0) -> None:
        """One frame for rows `[0, num_rows)` whose `active` flag is set: `predict_compute`, then
        `advance_compute`. `top_k_bound`: 0 to sample with sorting, FAST_TOP_K when every active row's request
        `selects_top_k`.

        Static shapes for a given (`num_rows`, `attended_length`): the two halves are what CUDA graphs capture.
        """
        self.predict_compute(num_rows, top_k_bound)
        self.advance_compute(num_rows, attended_length, top_k_bound)

    def predict_compute(self, num_rows: int, top_k_bound: int) -> None:
        """The frame of rows `[0, num_rows)` (the code predictor's 15 steps) into `out_frames`."""
        self.out_frames[:num_rows] = self._predict_frame(num_rows, top_k_bound)

    def advance_compute(self, num_rows: int, attended_length: int, top_k_bound: int) -> None:
        """The talker's forward over the frames in `out_frames`: the next codebook-0 ids into `out_code0`, and the
        state of the active rows one frame on."""
        rows = slice(0, num_rows)
        talker = self.model.talker
        frames = self.out_frames[rows]
        embeds = talker.embed_frame(frames) + talker.embed_text(self.text_ids[rows])
        positions = self.position[rows].clamp(max=self.max_positions - 1)[:, None]
        hidden, logits = self._talker_step(embeds[:, None], positions, num_rows, attended_length)
        code0 = self._pick_code0(logits, rows, top_k_bound)
        self._advance_rows(
            self.active[rows], hidden[:, -1], code0, self.out_code0[rows], self.last_hidden[rows],
            self.next_code0[rows], self.position[rows], self.num_generated[rows], self.generated_mask[rows],
        )  # fmt: skip

    def _talker_step(self, embeds, positions, num_rows: int, attended_length: int):
        """The talker's forward for one decode token per row over the paged cache: straight through the Triton
        kernels where they apply, else over a gathered copy of the rows' blocks whose new entries are written
        back."""
        talker, table = self.model.talker, self.kv_blocks.table[:num_rows]
        if talker.model.uses_kernels(1):
            return talker(embeds, positions, list(self.talker_cache), attended_length, table)
        table = table[:, : blocks_for(attended_length)].long()
        gathered = [layer[:, table].transpose(2, 3).flatten(3, 4) for layer in self.talker_cache]
        # A row that does not advance may sit past the gathered positions (a paused one): it computes at the last of
        # them, and nothing of it is written back.
        positions = positions.clamp(max=gathered[0].shape[3] - 1)
        hidden, logits = talker(embeds, positions, gathered, attended_length)
        rows, position = torch.arange(num_rows, device=self.device), positions[:, 0]
        advancing = self.active[:num_rows].bool()
        block = torch.where(advancing, table[rows, position // BLOCK_SIZE], SPARE_BLOCK)
        offset = position % BLOCK_SIZE
        for layer, copy in zip(self.talker_cache, gathered, strict=True):
            layer[:, block, :, offset] = copy[:, rows, :, position]
        return hidden, logits

    @torch.no_grad()
    def launch(self, active_rows: list[int], text_ids: list[int], max_position: int) -> DecodeLaunch:
        """Enqueue one frame for `active_rows` (slot indices), each adding its `text_ids` entry to the input, and
        return without waiting: the engine launches step N+1 before it reads step N (`collect`), so host work
        overlaps the GPU. `max_position`: the largest cache position any active row writes now.

        Host-side staging goes through NumPy views of the pinned buffers: every PyTorch call releases the GIL, and
        on a serving process whose event loop is busy each one can wait a switch interval to get it back."""
        num_rows = batch_bucket(max(active_rows) + 1, self.num_slots)
        attended_length = min(self.max_positions, (max_position // self.length_bucket + 1) * self.length_bucket)
        self.kv_blocks.upload()  # the blocks rows took or gave back since the last launch
        parity = self._launches % 2
        self._launches += 1
        staged = self._staged_inputs[parity]  # free again: the launch that used it two steps ago was collected
        staged[0] = 0
        staged[1] = self.config.text_ids.tts_pad
        staged[0, active_rows] = 1
        staged[1, active_rows] = text_ids
        self.step_inputs.copy_(self._host_inputs[parity], non_blocking=True)
        sorts = self._sorting_slots and not self._sorting_slots.isdisjoint(active_rows)
        top_k_bound = 0 if sorts else FAST_TOP_K
        # The frames go to the host as soon as the code predictor has made them: the talker's forward that follows
        # (a quarter of the step) only prepares the next frame, so a stream's frame, its first one included, is
        # handed out that much earlier (`collect_frames`).
        predict, advance = self._step_halves(num_rows, attended_length, top_k_bound)
        predict()
        self._host_frames[parity].copy_(self.out_frames, non_blocking=True)
        frames_done = step_done = None
        if self._events is not None:
            frames_done, step_done = self._events[parity]
            frames_done.record()
        advance()
        self._host_code0[parity].copy_(self.out_code0, non_blocking=True)
        if step_done is not None:
            step_done.record()
        return DecodeLaunch(
            active_rows, num_rows, self._staged_frames[parity], self._staged_code0[parity], frames_done, step_done
        )

    def _step_halves(self, num_rows: int, attended_length: int, top_k_bound: int):
        """The step's two halves as calls: graph replays, or the eager computations."""
        if self.graphs is not None:
            return self.graphs.halves(num_rows, attended_length, top_k_bound)
        return (
            lambda: self.predict_compute(num_rows, top_k_bound),
            lambda: self.advance_compute(num_rows, attended_length, top_k_bound),
        )

    def collect_frames(self, launch: DecodeLaunch) -> np.ndarray:
        """Wait for `launch`'s frames `[n, 16]` (active rows only); the rest of the step may still run."""
        if launch.frames_done is not None:
            launch.frames_done.synchronize()
        return launch.host_frames[launch.rows]

    def collect_code0(self, launch: DecodeLaunch) -> np.ndarray:
        """Wait for the whole of `launch`; its next codebook-0 ids `[n]` (active rows only)."""
        if launch.step_done is not None:
            launch.step_done.synchronize()
        return launch.host_code0[launch.rows]

    def collect(self, launch: DecodeLaunch) -> tuple[np.ndarray, np.ndarray]:
        """Wait for `launch`; its frames `[n, 16]` and next codebook-0 ids `[n]` (active rows only)."""
        return self.collect_frames(launch), self.collect_code0(launch)

    def decode(self, active_rows: list[int], text_ids: list[int], max_position: int):
        """`launch` and `collect` in one call."""
        return self.collect(self.launch(active_rows, text_ids, max_position))


@dataclasses.dataclass
class DecodeLaunch:
    rows: list[int]  # active slot indices
    num_rows: int  # rows the step computes: slots [0, num_rows), a batch bucket
    # Views of the pinned staging buffers: `out_frames` once `frames_done`, `out_code0` once `step_done`.
    host_frames: np.ndarray
    host_code0: np.ndarray
    frames_done: torch.cuda.Event | None  # None on CPU, where the step already ran
    step_done: torch.cuda.Event | None

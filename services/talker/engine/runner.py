"""The only device code of the talker: preallocated slot caches, prefill, the one-frame decode step, CUDA graphs.

State lives on the device in per-slot buffers, so a decode step needs from the host only which rows advance and
each row's trailing-text id, and hands back the finished frames and next codebook-0 ids (the one sync per step).
A decode step covers slot rows `[0, n)`: the scheduler packs live requests into the lowest free slots, and rows
that must not advance (free, paused, waiting for text) compute but keep their state.
"""

from __future__ import annotations

import dataclasses

import torch

from chorus.talker.models.qwen3_tts_talker import Qwen3TTSModel
from chorus.talker.models.speaker_encoder import log_mel_spectrogram
from chorus.talker.prompt import embed_prompt
from chorus.talker.sampling import RowParams, SamplingParams, choose, penalize_and_suppress, warp

LENGTH_BUCKET = 256
MIN_FRAMES = 2  # the reference bans EOS until two codebook-0 ids were generated
NEVER = 1 << 62
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)


def kv_bytes_per_position(model: Qwen3TTSModel, dtype: torch.dtype) -> int:
    """Talker K+V bytes for one cached position of one stream."""
    block = model.config.talker
    return 2 * block.num_hidden_layers * block.num_key_value_heads * block.head_dim * torch.finfo(dtype).bits // 8


def slots_for_memory(free_bytes: int, utilization: float, bytes_per_position: int, max_positions: int) -> int:
    """How many streams of `max_positions` fit in `utilization` of `free_bytes` (after weights and warm-up)."""
    return max(0, int(free_bytes * utilization) // (bytes_per_position * max_positions))


def batch_bucket(num_rows: int, max_rows: int) -> int:
    """The smallest bucket ≥ `num_rows` (capped at `max_rows`), so graphs exist for few distinct sizes."""
    for bucket in BATCH_BUCKETS:
        if bucket >= num_rows:
            return min(bucket, max_rows)
    return max_rows


@dataclasses.dataclass
class _SlotParams:
    talker: RowParams
    predictor: RowParams
    repetition_penalty: torch.Tensor


def _row_params(num_slots: int, device) -> RowParams:
    return RowParams(
        do_sample=torch.zeros(num_slots, dtype=torch.bool, device=device),
        temperature=torch.ones(num_slots, device=device),
        top_k=torch.zeros(num_slots, dtype=torch.long, device=device),
        top_p=torch.ones(num_slots, device=device),
        seed=torch.zeros(num_slots, dtype=torch.long, device=device),
    )


def _rows(params: RowParams, rows: slice) -> RowParams:
    return RowParams(*(getattr(params, field.name)[rows] for field in dataclasses.fields(RowParams)))


class TalkerRunner:
    """Owns the model, the slot KV caches and per-slot decode state on `device`."""

    def __init__(self, model: Qwen3TTSModel, num_slots: int, max_positions: int, use_cuda_graphs: bool = False):
        self.model = model
        self.config = model.config
        weight = model.talker.codec_head.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.num_slots, self.max_positions = num_slots, max_positions
        talker, predictor = self.config.talker, self.config.code_predictor
        self.talker_cache = torch.zeros(
            talker.num_hidden_layers,
            2,
            num_slots,
            talker.num_key_value_heads,
            max_positions,
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
        device, vocab = self.device, self.config.codec_vocab_size
        self.last_hidden = torch.zeros(num_slots, talker.hidden_size, device=device, dtype=self.dtype)
        self.next_code0 = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.position = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.num_generated = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.generated_mask = torch.zeros(num_slots, vocab, dtype=torch.bool, device=device)
        self.params = _SlotParams(
            _row_params(num_slots, device), _row_params(num_slots, device), torch.ones(num_slots, device=device)
        )
        self.min_frames = torch.full((num_slots,), MIN_FRAMES, dtype=torch.long, device=device)
        # Step inputs and outputs: static buffers, so a captured graph reads and writes the same memory.
        self.active = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.text_ids = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.out_frames = torch.zeros(num_slots, self.config.num_code_groups, dtype=torch.long, device=device)
        self.out_code0 = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.graphs = None
        if use_cuda_graphs and self.device.type == "cuda":
            from chorus.talker.engine.graphs import DecodeGraphs

            self.graphs = DecodeGraphs(self)

    def warmup(self, num_length_buckets: int = 1) -> None:
        """Capture decode graphs for every batch bucket (largest first, so later ones reuse its pool memory) and
        the first `num_length_buckets` attended lengths, before the service reports SERVING."""
        if self.graphs is None:
            return
        buckets = sorted({batch_bucket(n, self.num_slots) for n in range(1, self.num_slots + 1)}, reverse=True)
        for num_rows in buckets:
            for index in range(num_length_buckets):
                attended_length = min(self.max_positions, (index + 1) * LENGTH_BUCKET)
                if (num_rows, attended_length) not in self.graphs.graphs:
                    self.graphs.capture(num_rows, attended_length)

    def _cache_views(self, cache: torch.Tensor, rows: slice):
        return [layer[0, rows] for layer in cache], [layer[1, rows] for layer in cache]

    def set_params(self, slot: int, params: SamplingParams, seed: int, ignore_eos: bool = False) -> None:
        for target, do_sample, temperature, top_k, top_p in (
            (self.params.talker, params.do_sample, params.temperature, params.top_k, params.top_p),
            (
                self.params.predictor,
                params.subtalker_do_sample,
                params.subtalker_temperature,
                params.subtalker_top_k,
                params.subtalker_top_p,
            ),
        ):
            target.do_sample[slot] = do_sample
            target.temperature[slot] = temperature if do_sample else 1.0
            target.top_k[slot] = top_k
            target.top_p[slot] = top_p
            target.seed[slot] = seed
        self.params.repetition_penalty[slot] = params.repetition_penalty
        self.min_frames[slot] = NEVER if ignore_eos else MIN_FRAMES

    def _sample_code0(self, logits, rows: slice) -> torch.Tensor:
        ids = self.config.codec_ids
        scores = penalize_and_suppress(
            logits,
            self.generated_mask[rows],
            self.num_generated[rows],
            self.params.repetition_penalty[rows],
            self.min_frames[rows],
            ids.eos,
            self.config.first_control_id,
        )
        params = _rows(self.params.talker, rows)
        return choose(warp(scores, params), params, self.num_generated[rows], codebook=0)

    @torch.inference_mode()
    def speaker_vector(self, audio: torch.Tensor) -> torch.Tensor:
        """x-vector `[H]` of 24 kHz mono `audio [samples]` (Base checkpoints)."""
        assert self.model.speaker_encoder is not None, "validated by the prompt builder"
        mels = log_mel_spectrogram(audio.to(self.device, torch.float32)[None])
        return self.model.speaker_encoder(mels.to(self.dtype))[0]

    @torch.inference_mode()
    def embed_prompt(self, prompt, voice) -> torch.Tensor:
        return embed_prompt(self.model.talker, prompt, voice)

    @torch.inference_mode()
    def prefill(self, slot: int, embeds: torch.Tensor) -> None:
        """Run the prompt `embeds [L, H]` into `slot` and sample its first codebook-0 id (never EOS)."""
        num_positions = embeds.shape[0]
        assert num_positions < self.max_positions, "prompt longer than the cache; the engine checks this"
        rows = slice(slot, slot + 1)
        positions = torch.arange(num_positions, device=self.device)[None]
        cache_k, cache_v = self._cache_views(self.talker_cache, rows)
        hidden, logits = self.model.talker(embeds[None].to(self.dtype), positions, cache_k, cache_v, num_positions)
        self.generated_mask[rows] = False
        self.num_generated[rows] = 0
        code0 = self._sample_code0(logits, rows)
        self.last_hidden[rows] = hidden[:, -1]
        self.next_code0[rows] = code0
        self.position[rows] = num_positions
        self.num_generated[rows] = 1
        self.generated_mask[rows] = self.generated_mask[rows].scatter(1, code0[:, None], True)

    def _predict_frame(self, num_rows: int) -> torch.Tensor:
        """Codebooks 1..15 for rows `[0, num_rows)` → whole frames `[n, 16]`."""
        rows = slice(0, num_rows)
        talker, predictor = self.model.talker, self.model.talker.code_predictor
        cache_k, cache_v = self._cache_views(self.predictor_cache, rows)
        params = _rows(self.params.predictor, rows)
        frame_index = self.num_generated[rows] - 1
        code0 = self.next_code0[rows]
        inputs = torch.stack((self.last_hidden[rows], talker.embed_codec(code0)), dim=1)
        positions = torch.arange(2, device=self.device)[None].expand(num_rows, 2)
        codes = [code0]
        for codebook in range(1, self.config.num_code_groups):
            logits = predictor(inputs, positions, cache_k, cache_v, head_index=codebook - 1)
            code = choose(warp(logits.float(), params), params, frame_index, codebook)
            codes.append(code)
            inputs = predictor.embed(codebook, code)[:, None]
            positions = torch.full((num_rows, 1), codebook + 1, device=self.device, dtype=torch.long)
        return torch.stack(codes, dim=1)

    def decode_compute(self, num_rows: int, attended_length: int) -> None:
        """One frame for rows `[0, num_rows)` whose `active` flag is set; results in `out_frames` / `out_code0`.

        Static shapes for a given (`num_rows`, `attended_length`): this is the body CUDA graphs capture.
        """
        rows = slice(0, num_rows)
        talker = self.model.talker
        active = self.active[rows]
        frames = self._predict_frame(num_rows)
        embeds = talker.embed_frame(frames) + talker.embed_text(self.text_ids[rows])
        positions = self.position[rows].clamp(max=self.max_positions - 1)[:, None]
        cache_k, cache_v = self._cache_views(self.talker_cache, rows)
        hidden, logits = talker(embeds[:, None], positions, cache_k, cache_v, attended_length)
        code0 = self._sample_code0(logits, rows)
        self.out_frames[rows] = frames
        self.out_code0[rows] = code0
        self.last_hidden[rows] = torch.where(active[:, None], hidden[:, -1], self.last_hidden[rows])
        self.next_code0[rows] = torch.where(active, code0, self.next_code0[rows])
        self.position[rows] += active.long()
        self.num_generated[rows] += active.long()
        seen = self.generated_mask[rows].scatter(1, code0[:, None], True)
        self.generated_mask[rows] = torch.where(active[:, None], seen, self.generated_mask[rows])

    @torch.inference_mode()
    def decode(self, active_rows: list[int], text_ids: list[int], max_position: int):
        """Advance `active_rows` (slot indices) by one frame, each adding its `text_ids` entry to the input.

        `max_position`: the largest cache position any active row writes now. Returns host tensors
        (frames `[len(active_rows), 16]`, next codebook-0 ids `[len(active_rows)]`).
        """
        num_rows = batch_bucket(max(active_rows) + 1, self.num_slots)
        attended_length = min(self.max_positions, (max_position // LENGTH_BUCKET + 1) * LENGTH_BUCKET)
        index = torch.tensor(active_rows, dtype=torch.long)
        active = torch.zeros(num_rows, dtype=torch.bool)
        active[index] = True
        texts = torch.full((num_rows,), self.config.text_ids.tts_pad, dtype=torch.long)
        texts[index] = torch.tensor(text_ids, dtype=torch.long)
        self.active[:num_rows].copy_(active, non_blocking=True)
        self.text_ids[:num_rows].copy_(texts, non_blocking=True)
        if self.graphs is not None:
            self.graphs.run(num_rows, attended_length)
        else:
            self.decode_compute(num_rows, attended_length)
        frames = self.out_frames[:num_rows].cpu()
        code0 = self.out_code0[:num_rows].cpu()
        return frames[index], code0[index]

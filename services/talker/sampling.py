"""Device-side sampling with per-row parameters, in the reference's order (transformers 4.57 logits processors).

Codebook 0: repetition penalty over the row's generated codebook-0 ids → EOS banned before `min_frames` →
control ids suppressed except EOS → (sampling rows) temperature → top-k (ties kept) → top-p. Codebooks 1..15:
temperature → top-k → top-p only. Greedy rows take the first argmax.

The sort behind top-k and top-p is the costliest part of sampling on a GPU (a radix sort of the vocabulary per
codebook, 16 a frame: ~0.4 ms of a 5 ms step on an H200). When every sampling row keeps at most `FAST_TOP_K` ids
and top-p is off — the released defaults — `warp` needs only each row's k-th largest score, with the same result
(see `warp`): on CUDA from one Triton launch (`models.select_kernel`), elsewhere from a top-`FAST_TOP_K` selection.
Codebooks 1..15 then take the whole draw, and the drawn id's embedding, from one launch each
(`sample_code_and_embed`), not five.

Random draws come from a counter-based hash of (seed, frame, codebook, vocabulary id) turned into Gumbel noise,
so a row's draws depend only on its own seed and position: the same audio alone or in any batch, no generator
state to carry, and nothing that breaks CUDA-graph capture.
"""

from __future__ import annotations

import dataclasses

import torch

_MASK32 = 0xFFFFFFFF
FAST_TOP_K = 64  # the largest top-k that `warp`'s selection path serves (the released configs use 50)
SELECT_KERNEL_DEVICES = ("cuda",)  # where that path takes the k-th largest score from `models.select_kernel`


@dataclasses.dataclass
class RowParams:
    """Per-row sampling parameters as device tensors `[B]` (one row per live request)."""

    do_sample: torch.Tensor  # bool
    temperature: torch.Tensor  # float
    top_k: torch.Tensor  # int64, 0 = off
    top_p: torch.Tensor  # float, 1.0 = off
    seed: torch.Tensor  # int64


def _hash32(x: torch.Tensor) -> torch.Tensor:
    # Multipliers below 2**31 keep every product inside int64 without wrap-around.
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x346CA68B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seed: torch.Tensor, frame: torch.Tensor, codebook: int, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise `[B, vocab_size]` determined by `seed [B]`, `frame [B]` and `codebook` alone."""
    row = _hash32(_hash32(_hash32(seed) ^ (seed >> 32)) ^ (frame * 16 + codebook))
    ids = torch.arange(vocab_size, device=seed.device, dtype=torch.int64)
    # The row key is already avalanche-mixed, so xor-ing the id in and hashing again decorrelates neighbours.
    return -torch.log(-torch.log(open_uniform(_hash32(row[:, None] ^ ids[None, :]))))


def open_uniform(hashed: torch.Tensor) -> torch.Tensor:
    """32-bit hashes → float32 uniforms strictly inside (0, 1), so the Gumbel noise is always finite.

    23 bits, not 24: float32 holds `bits + 0.5` exactly only below 2**23, and with 24 bits the top value rounds to
    exactly 1.0 — infinite noise, which turns a suppressed id's -inf score into NaN and lets argmax pick it.
    """
    bits = hashed >> 9
    return (bits.float() + 0.5) / float(1 << 23)


def penalize_and_suppress(
    logits: torch.Tensor,
    generated_mask: torch.Tensor,
    num_generated: torch.Tensor,
    repetition_penalty: torch.Tensor,
    min_frames: torch.Tensor,
    eos_id: int,
    first_control_id: int,
) -> torch.Tensor:
    """Codebook-0 scores `[B, V]` (fp32) before temperature / top-k / top-p.

    `generated_mask [B, V]`: ids the row generated so far; `num_generated [B]`; `repetition_penalty [B]`;
    `min_frames [B]`: EOS is banned while fewer ids were generated (2 in the reference; huge to ignore EOS).
    """
    scores = logits.float()
    penalty = repetition_penalty[:, None]
    penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
    scores = torch.where(generated_mask, penalized, scores)
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    banned = (vocab >= first_control_id) & (vocab != eos_id)
    scores = scores.masked_fill(banned[None, :], float("-inf"))
    too_early = (num_generated < min_frames)[:, None] & (vocab == eos_id)[None, :]
    return scores.masked_fill(too_early, float("-inf"))


def warp(scores: torch.Tensor, params: RowParams, top_k_bound: int = 0) -> torch.Tensor:
    """Temperature → top-k → top-p on `scores [B, V]` for sampling rows; greedy rows pass through unchanged.

    One descending sort serves both filters: top-k keeps values ≥ the k-th largest (ties kept); top-p drops a token
    when the probability mass of it and every smaller token — the reference's ascending cumulative sum, summed in
    the same order — is ≤ 1 - top_p, never the top one.

    `top_k_bound` > 0 promises that every sampling row has 1 ≤ top_k ≤ `top_k_bound` and top_p = 1 (the caller
    checks): the k-th largest value then comes from a selection (`kth_largest`), without sorting the vocabulary.
    It keeps the same ids, but for ids whose probability underflows to 0 in float32 (≥ 87 below the largest score),
    which top-p's `mass > 0` test drops and this path keeps: no draw can pick them, since Gumbel noise from 23-bit
    uniforms spans less than 20, so `choose` returns the same ids either way.
    """
    warped = scores / params.temperature[:, None]
    if top_k_bound:
        kth = kth_largest(warped, params.top_k.clamp(1, top_k_bound), top_k_bound)
        return torch.where(params.do_sample[:, None], warped.masked_fill(warped < kth, float("-inf")), scores)
    vocab_size = scores.shape[-1]
    sorted_desc, order = warped.sort(dim=-1, descending=True)
    k = torch.where(params.top_k > 0, params.top_k.clamp(max=vocab_size), vocab_size)
    kth = sorted_desc.gather(-1, (k - 1)[:, None])
    in_top_k = sorted_desc >= kth
    probs = sorted_desc.masked_fill(~in_top_k, float("-inf")).softmax(dim=-1)
    mass_at_or_below = probs.flip(-1).cumsum(dim=-1).flip(-1)
    keep_sorted = in_top_k & (mass_at_or_below > (1 - params.top_p)[:, None])
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return torch.where(params.do_sample[:, None], warped.masked_fill(~keep, float("-inf")), scores)


def kth_largest(scores: torch.Tensor, k: torch.Tensor, top_k_bound: int) -> torch.Tensor:
    """The `k[b]`-th largest value `[B, 1]` of each row of `scores [B, V]`, ties counted, for `k` in 1..`top_k_bound`:
    one Triton launch on `SELECT_KERNEL_DEVICES`, else `torch.topk`'s top-`top_k_bound` values."""
    if scores.device.type in SELECT_KERNEL_DEVICES:
        from chorus.talker.models import select_kernel  # imports Triton: only where the kernel runs

        return select_kernel.kth_largest(scores, k)[:, None]
    return scores.topk(top_k_bound, dim=-1).values.gather(-1, (k - 1)[:, None])


def choose(scores: torch.Tensor, params: RowParams, frame: torch.Tensor, codebook: int) -> torch.Tensor:
    """Pick ids `[B]` from warped `scores [B, V]`: argmax for greedy rows, Gumbel-max draw for sampling rows."""
    noise = gumbel_noise(params.seed, frame, codebook, scores.shape[-1])
    drawn = (scores + noise).argmax(dim=-1)
    return torch.where(params.do_sample, drawn, scores.argmax(dim=-1))


def sample_code0(
    logits: torch.Tensor,
    generated_mask: torch.Tensor,
    num_generated: torch.Tensor,
    repetition_penalty: torch.Tensor,
    min_frames: torch.Tensor,
    params: RowParams,
    eos_id: int,
    first_control_id: int,
    top_k_bound: int = 0,
) -> torch.Tensor:
    """Codebook-0 ids `[B]` from talker `logits [B, V]`: penalties and suppression, then warp and choose."""
    scores = penalize_and_suppress(
        logits, generated_mask, num_generated, repetition_penalty, min_frames, eos_id, first_control_id
    )
    return choose(warp(scores, params, top_k_bound), params, num_generated, codebook=0)


def sample_code(
    logits: torch.Tensor, params: RowParams, frame: torch.Tensor, codebook: int, top_k_bound: int = 0
) -> torch.Tensor:
    """Ids `[B]` of codebook `codebook` (1..15) from code-predictor `logits [B, V]`."""
    return choose(warp(logits.float(), params, top_k_bound), params, frame, codebook)


def sample_code_and_embed(
    logits: torch.Tensor,
    params: RowParams,
    frame: torch.Tensor,
    codebook: int,
    embedding: torch.Tensor,
    top_k_bound: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_code`'s ids `[B]` and their rows `[B, H]` of `embedding [V, H]` (the code predictor's next input):
    on `SELECT_KERNEL_DEVICES` with `top_k_bound`, from one launch (`select_kernel.draw_top_k`), the same values."""
    if top_k_bound and logits.device.type in SELECT_KERNEL_DEVICES:
        from chorus.talker.models import select_kernel

        return select_kernel.draw_top_k(
            logits, params.do_sample, params.temperature, params.top_k, params.seed, frame, codebook, top_k_bound,
            embedding,
        )  # fmt: skip
    ids = sample_code(logits, params, frame, codebook, top_k_bound)
    return ids, torch.nn.functional.embedding(ids, embedding)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Host-side sampling settings of one request; defaults are the released `generation_config.json`."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Raise `ValueError` naming the first bad field."""
        for name in ("temperature", "subtalker_temperature", "repetition_penalty"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        for name in ("top_p", "subtalker_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name}: must be in (0, 1], got {getattr(self, name)}")
        for name in ("top_k", "subtalker_top_k"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0 = off), got {getattr(self, name)}")

    def selects_top_k(self) -> bool:
        """Whether `warp`'s selection path serves this request: each sampling stage keeps 1..`FAST_TOP_K` ids, no
        top-p."""
        stages = ((self.do_sample, self.top_k, self.top_p),
                  (self.subtalker_do_sample, self.subtalker_top_k, self.subtalker_top_p))  # fmt: skip
        return all(not sample or (1 <= top_k <= FAST_TOP_K and top_p >= 1.0) for sample, top_k, top_p in stages)

    @classmethod
    def from_generation_config(cls, values: dict) -> SamplingParams:
        """Defaults from a checkpoint's `generation_config.json` (missing keys keep the released values)."""
        names = {field.name for field in dataclasses.fields(cls)}
        renamed = {key.replace("subtalker_dosample", "subtalker_do_sample"): value for key, value in values.items()}
        return cls(**{key: value for key, value in renamed.items() if key in names and key != "seed"})

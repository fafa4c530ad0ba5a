"""The k-th largest score of each row, and a whole top-k draw, in one Triton launch each: `sampling` on CUDA.

Why: top-k sampling needs only the k-th largest score of a row (k ≤ 64), yet `torch.topk` finds it with a
multi-pass radix select (`gatherTopK`, ~20 µs a call on an H200) and then sorts its 64 results (~5 µs); at 16 calls
a frame that is ~0.4 ms of a ~4.6 ms decode step at batch 1.

How: one program per row holds the whole row in registers (`BLOCK`, the next power of two ≥ V, masked) and maps
each float32 to a uint32 key that orders like the float: positive floats set the sign bit, negative ones flip every
bit, so -inf is 0x007FFFFF and padding (key 0) lies below every float. A search from the top bits down then finds
the largest key t with count(key ≥ t) ≥ k, `DIGIT_BITS` bits a pass: for each of the 2^DIGIT_BITS next digits one
reduction over the row counts the keys at or above it (all of them in one 2-D reduction), and the largest digit that
keeps k is taken — 16 passes at 2 bits, where a binary search takes 32 one after the other. On an H100 a launch in a
chain of 50 took 11.5 µs for a draw and 9.9 for `kth_largest` at 2 bits, 14.6 and 12.9 at 1, 14.5 and 18.0 at 4
(bench/results/draw-digit-bits-622ce9d.txt): 4 bits' 16 counts a pass cost more than the passes they save. That key
is exactly the k-th largest, ties counted with multiplicity as `topk(...).values[k - 1]` counts them. The float
comes back from the key bit for bit (-inf where fewer than k scores are finite, as with topk). The one difference
from topk: -0.0 orders below +0.0, which compare equal as floats, so `warped < kth` keeps the same ids.

Where the scores are logits of 16 bits (bf16, fp16), `draw_top_k` searches their 16-bit keys, 8 passes at 2 bits:
a temperature > 0 divides without reversing any order, so the k-th largest warped score is the k-th largest logit
divided by it, bit for bit. On an H100 a bf16 draw in a chain of 50 took 5.9 µs against 9.1 with 32-bit keys, and
a 0.6B step at batch 1 3.45–3.47 ms against 3.54–3.55 (bench/results/draw-key-bits-771f74e.txt, talker-20261126-220446).

`draw_top_k` is a code-predictor codebook's whole draw (`sampling.sample_code_and_embed` on its top-k path) in one
program per row: temperature, the k-th largest warped score as above, the top-k filter, Gumbel noise from
`sampling`'s counter hash, the first of the maxima (greedy rows: of the raw scores), and the drawn id's row of the
embedding table, the code predictor's next input. Compiled from PyTorch that was five launches (the quotient, k's
clamp, the selection, the noise and argmax, the lookup): 60 a frame fewer at every batch size.

`kth_largest` and `draw_top_k` are `torch.library.custom_op`s with a fake implementation, so
`torch.compile(fullgraph=True, dynamic=True)` keeps each as one opaque call (the row length stays a runtime value:
`BLOCK` is picked per call) and CUDA graphs capture its single launch; neither syncs with the host nor allocates
beyond its outputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from chorus.talker.models import pdl
from chorus.talker.models.pdl import let_next_kernel_start, wait_for_previous_kernel

DIGIT_BITS = 2  # bits of the k-th largest key found per pass over the row (see the module docstring)


@triton.jit
def _order_keys(bits, in_row, KEY_BITS: tl.constexpr):
    """Float bit patterns `KEY_BITS` wide (32, or 16 for bf16 / fp16, held in uint32) → uint32 keys that order like
    the floats; 0 (below every float) outside the row."""
    sign = tl.full((), 1 << (KEY_BITS - 1), tl.uint32)
    ones = tl.full((), (1 << KEY_BITS) - 1, tl.uint32)
    keys = tl.where((bits & sign) != 0, bits ^ ones, bits | sign)
    return tl.where(in_row, keys, tl.zeros_like(keys))


@triton.jit
def _kth_largest_bits(keys, k, DIGIT_BITS: tl.constexpr, KEY_BITS: tl.constexpr):
    """The bit pattern (`KEY_BITS` wide, in uint32) of the k-th largest float of a row from its `_order_keys`: the
    search of the module docstring, `DIGIT_BITS` a pass."""
    tl.static_assert(KEY_BITS % DIGIT_BITS == 0)
    sign = tl.full((), 1 << (KEY_BITS - 1), tl.uint32)
    ones = tl.full((), (1 << KEY_BITS) - 1, tl.uint32)
    digits = tl.arange(0, 1 << DIGIT_BITS).to(tl.uint32)
    threshold = tl.zeros((), tl.uint32)
    for shift in tl.static_range(KEY_BITS - DIGIT_BITS, -1, -DIGIT_BITS):
        candidates = threshold | (digits << shift)
        counts = tl.sum((keys[:, None] >= candidates[None, :]).to(tl.int32), axis=0)
        # Counts fall as the digit grows, and digit 0 keeps ≥ k: the largest digit keeping ≥ k is how many others do.
        digit = tl.sum(((counts >= k) & (digits > 0)).to(tl.uint32), axis=0)
        threshold = threshold | (digit << shift)
    return tl.where((threshold & sign) != 0, threshold ^ sign, threshold ^ ones)


@triton.jit
def _kth_largest_kernel(
    scores_ptr, k_ptr, out_ptr, stride_row, num_cols, BLOCK: tl.constexpr, DIGIT_BITS: tl.constexpr, PDL: tl.constexpr
):
    wait_for_previous_kernel(PDL)  # launched while the kernel writing the scores ends: see `pdl`
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    in_row = cols < num_cols
    bits = tl.load(scores_ptr + row * stride_row + cols, mask=in_row, other=0.0).to(tl.uint32, bitcast=True)
    kth_bits = _kth_largest_bits(_order_keys(bits, in_row, 32), tl.load(k_ptr + row), DIGIT_BITS, 32)
    tl.store(out_ptr + row, kth_bits.to(tl.float32, bitcast=True))


@triton.jit
def _hash32(x):
    # `sampling._hash32` on uint32: its int64 products masked to 32 bits are these wrapping products.
    x = (x ^ (x >> 16)) * tl.full((), 0x7FEB352D, tl.uint32)
    x = (x ^ (x >> 15)) * tl.full((), 0x346CA68B, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _draw_top_k_kernel(
    logits_ptr, do_sample_ptr, temperature_ptr, top_k_ptr, seed_ptr, frame_ptr, table_ptr, out_ptr, embedded_ptr,
    stride_row, num_cols, stride_table, hidden_size, codebook, top_k_bound, BLOCK: tl.constexpr,
    BLOCK_HIDDEN: tl.constexpr, DIGIT_BITS: tl.constexpr, KEY_BITS: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    wait_for_previous_kernel(PDL)
    # The next kernel (the code predictor's next projection) may start now and read its weights while this one
    # searches: this one runs a program a row, leaving most of the GPU idle. (Not measured apart from the rest.)
    let_next_kernel_start(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    in_row = cols < num_cols
    logits = tl.load(logits_ptr + row * stride_row + cols, mask=in_row, other=float("-inf"))
    scores = logits.to(tl.float32)
    if tl.load(do_sample_ptr + row) != 0:
        # `warp`: temperature, then the top-k filter through the k-th largest warped score.
        temperature = tl.load(temperature_ptr + row)
        warped = scores / temperature
        k = tl.minimum(tl.maximum(tl.load(top_k_ptr + row), 1), top_k_bound)
        if KEY_BITS == 16:
            # Dividing by a temperature > 0 never reverses an order, so the k-th largest warped score is the k-th
            # largest logit divided the same way, bit for bit: searched among 16-bit keys, half the passes.
            bits = logits.to(tl.uint16, bitcast=True).to(tl.uint32)
            kth_bits = _kth_largest_bits(_order_keys(bits, in_row, 16), k, DIGIT_BITS, 16)
            kth = kth_bits.to(tl.uint16).to(logits.dtype, bitcast=True).to(tl.float32) / temperature
        else:
            kth_bits = _kth_largest_bits(_order_keys(warped.to(tl.uint32, bitcast=True), in_row, 32), k, DIGIT_BITS, 32)
            kth = kth_bits.to(tl.float32, bitcast=True)
        warped = tl.where(warped < kth, float("-inf"), warped)
        # `choose`: Gumbel noise from the hash of (seed, frame, codebook, id), as `sampling.gumbel_noise` draws it.
        seed = tl.load(seed_ptr + row)
        key = _hash32(seed.to(tl.uint32)) ^ (seed >> 32).to(tl.uint32)  # casts to uint32 keep the low 32 bits
        key = _hash32(_hash32(key) ^ (tl.load(frame_ptr + row) * 16 + codebook).to(tl.uint32))
        uniform = ((_hash32(key ^ cols.to(tl.uint32)) >> 9).to(tl.float32) + 0.5) / 8388608.0
        scores = tl.where(in_row, warped + -tl.log(-tl.log(uniform)), float("-inf"))
    drawn = tl.argmax(scores, axis=0).to(tl.int64)  # the first of equal maxima, as torch's
    tl.store(out_ptr + row, drawn)
    hidden = tl.arange(0, BLOCK_HIDDEN)
    in_hidden = hidden < hidden_size
    embedded = tl.load(table_ptr + drawn * stride_table + hidden, mask=in_hidden)
    tl.store(embedded_ptr + row * hidden_size + hidden, embedded, mask=in_hidden)


@torch.library.custom_op("chorus::kth_largest", mutates_args=())
def kth_largest(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The `k[b]`-th largest value `[B]` (float32) of each row of `scores [B, V]` (float32); `k [B]` (int64) in
    [1, V]."""
    assert scores.dtype == torch.float32 and scores.dim() == 2 and k.dtype == torch.int64
    scores = scores if scores.stride(-1) == 1 else scores.contiguous()
    batch, num_cols = scores.shape
    out = scores.new_empty(batch)
    if batch:
        block = triton.next_power_of_2(num_cols)  # 8 warps: 8 or 16 keys a thread at V = 2048 / 3072 (untuned)
        uses_pdl = pdl.enabled(scores)
        _kth_largest_kernel[(batch,)](
            scores, k.contiguous(), out, scores.stride(0), num_cols, BLOCK=block, DIGIT_BITS=DIGIT_BITS,
            PDL=uses_pdl, num_warps=8, launch_pdl=uses_pdl,
        )  # fmt: skip
    return out


@kth_largest.register_fake
def _(scores: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return scores.new_empty(scores.shape[0])


@torch.library.custom_op("chorus::draw_top_k", mutates_args=())
def draw_top_k(
    logits: torch.Tensor,
    do_sample: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    seed: torch.Tensor,
    frame: torch.Tensor,
    codebook: int,
    top_k_bound: int,
    embedding: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sampling.sample_code_and_embed` in one launch: ids `[B]` (int64) from `logits [B, V]`, the rows'
    `do_sample`, `temperature`, `top_k` (clamped to 1..`top_k_bound`, top-p off), `seed` and `frame` `[B]`; and
    their rows `[B, H]` of `embedding [V, H]`."""
    assert logits.dim() == 2 and logits.stride(-1) == 1 and embedding.stride(-1) == 1
    assert logits.dtype in (torch.float32, torch.bfloat16, torch.float16)
    batch, num_cols = logits.shape
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    embedded = embedding.new_empty(batch, embedding.shape[1])
    if batch:
        uses_pdl = pdl.enabled(logits)
        _draw_top_k_kernel[(batch,)](
            logits, do_sample.contiguous(), temperature.contiguous(), top_k.contiguous(), seed.contiguous(),
            frame.contiguous(), embedding, out, embedded, logits.stride(0), num_cols, embedding.stride(0),
            embedding.shape[1], codebook, top_k_bound, BLOCK=triton.next_power_of_2(num_cols),
            BLOCK_HIDDEN=triton.next_power_of_2(embedding.shape[1]), DIGIT_BITS=DIGIT_BITS,
            KEY_BITS=8 * logits.element_size(), PDL=uses_pdl, num_warps=8, launch_pdl=uses_pdl,
        )  # fmt: skip
    return out, embedded


@draw_top_k.register_fake
def _(logits, do_sample, temperature, top_k, seed, frame, codebook, top_k_bound, embedding):
    ids = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
    return ids, embedding.new_empty(logits.shape[0], embedding.shape[1])

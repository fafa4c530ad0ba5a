"""A Triton kernel for a decode step's attention on CUDA: what lies between a layer's QKV projection and its output
projection, in one launch instead of eight.

A decode step is bound by the number of kernels it launches, not by arithmetic: at batch 1 the compiled layer
spent ~13 µs per layer in q/k norm, rotation, the stack and transpose of keys and values, the cache scatter and the
three attention kernels. `decode_attention` runs one program per (row, key head). It RMS-normalises the row's new
keys (1 or 2 tokens) with their norm weight, rotates them (NeoX halves, angles from the row's position) and writes
them and the values straight into the row's cache; then it does the same for the queries of that head group, in
registers, and attends them over the row's cached keys, reading only positions up to the row's own — the cache
length is an upper bound, not the work done. Until 2026-11-26 the norm, rotation and cache write were a kernel of
their own, which stored the queries for the attention kernel to read: 103 launches more a frame at 0.6B.

The cache is paged: `[2, blocks, kv_heads, block_size, D]`, and a row's position p lives in block
`block_table[row, p // block_size]` at offset `p % block_size`, so streams share one pool of blocks instead of each
holding the longest request's worth. A cache of one block per row (`block_table[row] = [row]`) is the unpaged case.

It computes in fp32 and rounds where the compiled PyTorch path rounds (normalised values and cos/sin to the
activation dtype before scaling; queries and keys after rotation), so replacing that path changes results only at
bf16 rounding level. It launches with programmatic dependent launch where the GPU has it (see `pdl`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from chorus.talker.models import pdl
from chorus.talker.models.pdl import let_next_kernel_start, wait_for_previous_kernel

MAX_DECODE_TOKENS = 2  # the code predictor's first step feeds 2 tokens; every other decode step 1


def supports(head_dim: int, num_heads: int, num_kv_heads: int, dtype: torch.dtype) -> bool:
    """Whether these kernels cover a layer of this shape (tensor-core tiles need a power-of-two head_dim ≥ 16)."""
    group = num_heads // num_kv_heads
    is_power_of_two = head_dim & (head_dim - 1) == 0
    return is_power_of_two and head_dim >= 16 and group * MAX_DECODE_TOKENS <= 16 and dtype in _DOT_PRECISION


_DOT_PRECISION = {torch.bfloat16: "tf32", torch.float16: "tf32", torch.float32: "ieee"}


@triton.jit
def _rotation(position, log2_theta, HEAD_DIM: tl.constexpr, dtype: tl.constexpr):
    """cos and sin `[N, D]` at `position [N]`, rounded to the activation dtype: NeoX halves, the first pairing with
    the second; angle_i = position · theta^(-2 (i mod half) / D)."""
    dims = tl.arange(0, HEAD_DIM)
    inv_freq = tl.exp2(-((dims % (HEAD_DIM // 2)) * 2).to(tl.float32) / HEAD_DIM * log2_theta)
    angle = position.to(tl.float32)[:, None] * inv_freq[None, :]
    return tl.cos(angle).to(dtype).to(tl.float32), tl.sin(angle).to(dtype).to(tl.float32)


@triton.jit
def _normalise_and_rotate(x, x_partner, weight, weight_partner, cos, sin, eps, HEAD_DIM: tl.constexpr):
    """Heads `x [N, D]` (fp32, `x_partner` their NeoX partners: dimension i + D/2 mod D) RMS-normalised, rounded to
    the activation dtype (the norm weight's), scaled by the weight `[D]`, then rotated by `cos`, `sin [N, D]`."""
    dims = tl.arange(0, HEAD_DIM)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
    normed = (x * inv_rms).to(weight.dtype).to(tl.float32) * weight.to(tl.float32)[None, :]
    normed_partner = (x_partner * inv_rms).to(weight.dtype).to(tl.float32) * weight_partner.to(tl.float32)[None, :]
    return normed * cos + tl.where((dims < HEAD_DIM // 2)[None, :], -normed_partner, normed_partner) * sin


@triton.jit
def _row_of(tile, index, rows):
    """Row `index [N]` (each in `rows`, the tile's row ids) of `tile [R, D]` for each of N: `[N, D]` (R = 2)."""
    first = tl.sum(tl.where(rows[:, None] == 0, tile, 0.0), axis=0)
    second = tl.sum(tl.where(rows[:, None] == 1, tile, 0.0), axis=0)
    return tl.where(index[:, None] == 0, first[None, :], second[None, :])


@triton.jit
def _decode_attention_kernel(
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    cache_ptr,
    table_ptr,
    positions_ptr,
    out_ptr,
    stride_qkv_row,
    stride_qkv_token,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_head,
    stride_cache_position,
    stride_table_row,
    stride_out_row,
    stride_out_token,
    num_tokens,
    eps,
    log2_theta,
    scale,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_QUERIES: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    tl.static_assert(BLOCK_TOKENS == 2)  # `_row_of` picks a query's token from two
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    dims = tl.arange(0, HEAD_DIM)
    partner = (dims + HEAD_DIM // 2) % HEAD_DIM
    dtype = qkv_ptr.dtype.element_ty
    source = qkv_ptr + row * stride_qkv_row

    # This key head's new keys and values (the row's 1 or 2 tokens) into the cache, keys normalised and rotated.
    new = tl.arange(0, BLOCK_TOKENS)
    is_new = new < num_tokens
    new_position = tl.load(positions_ptr + row * num_tokens + new, mask=is_new, other=0)
    new_block = tl.load(table_ptr + row * stride_table_row + new_position // BLOCK_SIZE, mask=is_new, other=0)
    slot = new_block.to(tl.int64) * stride_cache_block + (new_position % BLOCK_SIZE) * stride_cache_position
    slot = cache_ptr + slot[:, None] + kv_head * stride_cache_head + dims[None, :]
    k_source = source + new[:, None] * stride_qkv_token + (NUM_HEADS + kv_head) * HEAD_DIM
    new_k = tl.load(k_source + dims[None, :], mask=is_new[:, None], other=0.0).to(tl.float32)
    k_partner = tl.load(k_source + partner[None, :], mask=is_new[:, None], other=0.0).to(tl.float32)
    k_weight, k_weight_partner = tl.load(k_norm_ptr + dims), tl.load(k_norm_ptr + partner)
    cos, sin = _rotation(new_position, log2_theta, HEAD_DIM, dtype)  # once per token: its queries share them
    new_k = _normalise_and_rotate(new_k, k_partner, k_weight, k_weight_partner, cos, sin, eps, HEAD_DIM)
    tl.store(slot, new_k.to(dtype), mask=is_new[:, None])
    new_v = tl.load(k_source + NUM_KV_HEADS * HEAD_DIM + dims[None, :], mask=is_new[:, None], other=0.0)
    tl.store(slot + stride_cache_kv, new_v, mask=is_new[:, None])

    # Query rows of this key head: (group member g, token t) → g * T + t; padded to a tensor-core tile.
    query = tl.arange(0, BLOCK_QUERIES)
    is_query = query < GROUP * num_tokens
    member = query // num_tokens
    token = query % num_tokens
    head = kv_head * GROUP + member
    q_source = source + token[:, None] * stride_qkv_token + head[:, None] * HEAD_DIM
    q = tl.load(q_source + dims[None, :], mask=is_query[:, None], other=0.0).to(tl.float32)
    q_partner = tl.load(q_source + partner[None, :], mask=is_query[:, None], other=0.0).to(tl.float32)
    query_position = tl.load(positions_ptr + row * num_tokens + token, mask=is_query, other=0)
    q_weight, q_weight_partner = tl.load(q_norm_ptr + dims), tl.load(q_norm_ptr + partner)
    q_cos, q_sin = _row_of(cos, token, new), _row_of(sin, token, new)
    q = _normalise_and_rotate(q, q_partner, q_weight, q_weight_partner, q_cos, q_sin, eps, HEAD_DIM).to(dtype)
    last_position = tl.max(query_position, axis=0)
    tl.debug_barrier()  # the keys and values stored above are read below by the program's other threads

    running_max = tl.full([BLOCK_QUERIES], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_QUERIES], tl.float32)
    acc = tl.zeros([BLOCK_QUERIES, HEAD_DIM], tl.float32)
    for index in range(0, NUM_BLOCKS):
        start = index * BLOCK_SIZE
        if start <= last_position:  # blocks past every query's position are skipped, not read
            block = tl.load(table_ptr + row * stride_table_row + index).to(tl.int64)
            keys_ptr = cache_ptr + block * stride_cache_block + kv_head * stride_cache_head
            values_ptr = keys_ptr + stride_cache_kv
            offset = tl.arange(0, BLOCK_SIZE)
            key = start + offset
            is_written = key <= last_position
            offsets = offset[:, None] * stride_cache_position + dims[None, :]
            k = tl.load(keys_ptr + offsets, mask=is_written[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            scores = tl.where(key[None, :] <= query_position[:, None], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_max[:, None])
            correction = tl.exp(running_max - new_max)
            running_sum = running_sum * correction + tl.sum(weights, axis=1)
            v = tl.load(values_ptr + offsets, mask=is_written[:, None], other=0.0)
            acc = acc * correction[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            running_max = new_max
    let_next_kernel_start(PDL)
    out = acc / running_sum[:, None]
    out_offsets = row * stride_out_row + token * stride_out_token + head * HEAD_DIM
    tl.store(out_ptr + out_offsets[:, None] + dims[None, :], out.to(dtype), mask=is_query[:, None])


def decode_attention(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    positions: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_heads: int,
    eps: float,
    rope_theta: float,
) -> torch.Tensor:
    """Attention output `[B, T, heads * D]` of a decode step's `qkv [B, T, (heads + 2 kv_heads) D]` at `positions
    [B, T]`: its keys and values go into the paged `kv_cache [2, blocks, kv_heads, block_size, D]` (row i's blocks:
    `block_table[i]`), then each normalised, rotated query attends the row's keys at positions ≤ its own."""
    batch, num_tokens, _ = qkv.shape
    _, _, num_kv_heads, block_size, head_dim = kv_cache.shape
    assert qkv.stride(2) == 1 and kv_cache.stride(4) == 1 and positions.is_contiguous() and block_table.stride(1) == 1
    assert num_tokens <= MAX_DECODE_TOKENS
    out = qkv.new_empty(batch, num_tokens, num_heads * head_dim)
    uses_pdl = pdl.enabled(qkv)
    _decode_attention_kernel[(batch, num_kv_heads)](
        qkv,
        q_norm_weight,
        k_norm_weight,
        kv_cache,
        block_table,
        positions,
        out,
        *qkv.stride()[:2],
        *kv_cache.stride()[:4],
        block_table.stride(0),
        *out.stride()[:2],
        num_tokens,
        eps,
        math.log2(rope_theta),
        head_dim**-0.5,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_QUERIES=16,
        BLOCK_TOKENS=MAX_DECODE_TOKENS,
        NUM_BLOCKS=block_table.shape[1],
        BLOCK_SIZE=block_size,
        PRECISION=_DOT_PRECISION[qkv.dtype],
        PDL=uses_pdl,
        num_warps=4,
        launch_pdl=uses_pdl,
    )
    return out

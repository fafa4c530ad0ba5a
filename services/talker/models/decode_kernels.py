"""Triton kernel for a decode step's attention on CUDA: what lies between a layer's QKV projection and its output
projection, in one launch instead of eight.

A decode step is bound by the number of kernels it launches, not by arithmetic: at batch 1 the compiled layer
spent ~13 µs per layer in q/k norm, rotation, the stack and transpose of keys and values, the cache scatter and the
three attention kernels. Here `qk_norm_rope_attention` runs one program per (row, key head), which:

- RMS-normalises the row's new query heads of that head group and its new keys (1 or 2 tokens) with their norm
  weights and rotates them (NeoX halves, angles from each token's position);
- writes the new keys and values into the row's cache at their positions, for later steps;
- attends the group's queries over the row's cached positions before its first new token, read from the cache —
  the cache length is an upper bound, not the work done — and then over the new tokens themselves, causally, from
  registers. A program never reads what it writes, so nothing orders the two, and it reads only blocks of its own
  row, which no other row's program writes (block tables hand each row blocks of its own).

The cache is paged: `[2, blocks, kv_heads, block_size, D]`, and a row's position p lives in block
`block_table[row, p // block_size]` at offset `p % block_size`, so streams share one pool of blocks instead of each
holding the longest request's worth. A cache of one block per row (`block_table[row] = [row]`) is the unpaged case.

It computes in fp32 and rounds where the compiled PyTorch path rounds (normalised values and cos/sin to the
activation dtype before scaling; rotated queries and keys to it before the products), so replacing that path
changes results only at bf16 rounding level.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

MAX_DECODE_TOKENS = 2  # the code predictor's first step feeds 2 tokens; every other decode step 1
_TILE = 16  # query rows (group members × tokens) and new-key rows, padded to the smallest tensor-core tile


def supports(head_dim: int, num_heads: int, num_kv_heads: int, dtype: torch.dtype) -> bool:
    """Whether the kernel covers a layer of this shape (tensor-core tiles need a power-of-two head_dim ≥ 16)."""
    group = num_heads // num_kv_heads
    is_power_of_two = head_dim & (head_dim - 1) == 0
    return is_power_of_two and head_dim >= 16 and group * MAX_DECODE_TOKENS <= _TILE and dtype in _DOT_PRECISION


_DOT_PRECISION = {torch.bfloat16: "tf32", torch.float16: "tf32", torch.float32: "ieee"}


@triton.jit
def _normed_rotated(qkv_ptr, offsets, is_valid, norm_ptr, position, eps, log2_theta, HEAD_DIM: tl.constexpr):
    """Heads `[rows, D]` at `qkv_ptr + offsets [rows]` (rows not `is_valid`: zeros) RMS-normalised in fp32, rounded
    to the activation dtype, scaled by the norm weight at `norm_ptr`, then rotated by `position [rows]`."""
    dims = tl.arange(0, HEAD_DIM)
    half = HEAD_DIM // 2
    partner = (dims + half) % HEAD_DIM
    dtype = qkv_ptr.dtype.element_ty
    x = tl.load(qkv_ptr + offsets[:, None] + dims[None, :], mask=is_valid[:, None], other=0.0).to(tl.float32)
    x_partner = tl.load(qkv_ptr + offsets[:, None] + partner[None, :], mask=is_valid[:, None], other=0.0)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]
    weight = tl.load(norm_ptr + dims).to(tl.float32)[None, :]
    weight_partner = tl.load(norm_ptr + partner).to(tl.float32)[None, :]
    normed = (x * inv_rms).to(dtype).to(tl.float32) * weight
    normed_partner = (x_partner.to(tl.float32) * inv_rms).to(dtype).to(tl.float32) * weight_partner
    # NeoX rotation: the first half pairs with the second; angle_i = position · theta^(-2 (i mod half) / D).
    inv_freq = tl.exp2(-((dims % half) * 2).to(tl.float32) / HEAD_DIM * log2_theta)
    angle = position.to(tl.float32)[:, None] * inv_freq[None, :]
    cos = tl.cos(angle).to(dtype).to(tl.float32)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    return (normed * cos + tl.where(dims[None, :] < half, -normed_partner, normed_partner) * sin).to(dtype)


@triton.jit
def _attend(q, k, v, is_visible, running_max, running_sum, acc, scale, PRECISION: tl.constexpr):
    """Online softmax: the running (max, sum, output) of queries `q [Q, D]` after keys `k [K, D]` with values
    `v [K, D]`, where `is_visible` (broadcast to `[Q, K]`); every query must have seen a key by the end."""
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    scores = tl.where(is_visible, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    weights = tl.exp(scores - new_max[:, None])
    correction = tl.exp(running_max - new_max)
    running_sum = running_sum * correction + tl.sum(weights, axis=1)
    acc = acc * correction[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
    return new_max, running_sum, acc


@triton.jit
def _qk_norm_rope_attention_kernel(
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    positions_ptr,
    cache_ptr,
    table_ptr,
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
    TILE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    dims = tl.arange(0, HEAD_DIM)
    row_positions = positions_ptr + row * num_tokens
    row_qkv = row * stride_qkv_row

    # 1. Query rows of this key head: (group member g, token t) → g · T + t, padded to a tile. Padding rows keep a
    #    real token (t < T), so their position is real too and no query row ever sees no key.
    query = tl.arange(0, TILE)
    is_query = query < GROUP * num_tokens
    token = query % num_tokens
    head = kv_head * GROUP + query // num_tokens
    query_position = tl.load(row_positions + token)
    q_offsets = row_qkv + token * stride_qkv_token + head * HEAD_DIM
    q = _normed_rotated(qkv_ptr, q_offsets, is_query, q_norm_ptr, query_position, eps, log2_theta, HEAD_DIM)

    # 2. The new keys and values (rows t < T of a tile) into the cache at their positions.
    new = tl.arange(0, TILE)
    is_new = new < num_tokens
    new_position = tl.load(row_positions + new, mask=is_new, other=0)
    new_offsets = row_qkv + new * stride_qkv_token
    k_offsets = new_offsets + (NUM_HEADS + kv_head) * HEAD_DIM
    k_new = _normed_rotated(qkv_ptr, k_offsets, is_new, k_norm_ptr, new_position, eps, log2_theta, HEAD_DIM)
    v_offsets = new_offsets + (NUM_HEADS + NUM_KV_HEADS + kv_head) * HEAD_DIM
    v_new = tl.load(qkv_ptr + v_offsets[:, None] + dims[None, :], mask=is_new[:, None], other=0.0)
    new_block = tl.load(table_ptr + row * stride_table_row + new_position // BLOCK_SIZE, mask=is_new, other=0)
    slots = (
        new_block.to(tl.int64) * stride_cache_block
        + kv_head * stride_cache_head
        + (new_position % BLOCK_SIZE) * stride_cache_position
    )
    tl.store(cache_ptr + slots[:, None] + dims[None, :], k_new, mask=is_new[:, None])
    tl.store(cache_ptr + stride_cache_kv + slots[:, None] + dims[None, :], v_new, mask=is_new[:, None])

    # 3. Attention over the cached positions before the row's first new token, block by block (none for a row
    #    at position 0, whose first block then holds nothing yet) ...
    running_max = tl.full([TILE], float("-inf"), tl.float32)
    running_sum = tl.zeros([TILE], tl.float32)
    acc = tl.zeros([TILE, HEAD_DIM], tl.float32)
    first_position = tl.load(row_positions)
    offset = tl.arange(0, BLOCK_SIZE)
    cache_offsets = offset[:, None] * stride_cache_position + dims[None, :]
    for start in range(0, first_position, BLOCK_SIZE):
        block = tl.load(table_ptr + row * stride_table_row + start // BLOCK_SIZE).to(tl.int64)
        keys_ptr = cache_ptr + block * stride_cache_block + kv_head * stride_cache_head
        is_cached = start + offset < first_position
        k = tl.load(keys_ptr + cache_offsets, mask=is_cached[:, None], other=0.0)
        v = tl.load(keys_ptr + stride_cache_kv + cache_offsets, mask=is_cached[:, None], other=0.0)
        running_max, running_sum, acc = _attend(
            q, k, v, is_cached[None, :], running_max, running_sum, acc, scale, PRECISION
        )
    # ... then over the new tokens, from registers: each query sees those at positions up to its own.
    is_visible = is_new[None, :] & (new_position[None, :] <= query_position[:, None])
    _, running_sum, acc = _attend(q, k_new, v_new, is_visible, running_max, running_sum, acc, scale, PRECISION)

    out = acc / running_sum[:, None]
    out_offsets = row * stride_out_row + token * stride_out_token + head * HEAD_DIM
    tl.store(out_ptr + out_offsets[:, None] + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=is_query[:, None])


def qk_norm_rope_attention(
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
    """Attention output `[B, T, heads * D]` of `qkv [B, T, (heads + 2 kv_heads) D]` at `positions [B, T]`:
    queries and keys normalised and rotated, each query attending the keys at positions ≤ its own. The new keys and
    values go into the paged `kv_cache [2, blocks, kv_heads, block_size, D]` at their positions of each row's blocks
    (`block_table [B, blocks per row]`); what lies before a row's first position `positions[:, 0]` is read from it,
    so a row's T tokens must sit at consecutive positions."""
    batch, num_tokens, _ = qkv.shape
    _, _, num_kv_heads, block_size, head_dim = kv_cache.shape
    assert qkv.stride(2) == 1 and kv_cache.stride(4) == 1 and positions.is_contiguous() and block_table.stride(1) == 1
    assert num_heads // num_kv_heads * num_tokens <= _TILE
    out = qkv.new_empty(batch, num_tokens, num_heads * head_dim)
    _qk_norm_rope_attention_kernel[(batch, num_kv_heads)](
        qkv,
        q_norm_weight,
        k_norm_weight,
        positions,
        kv_cache,
        block_table,
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
        TILE=_TILE,
        BLOCK_SIZE=block_size,
        PRECISION=_DOT_PRECISION[qkv.dtype],
        num_warps=4,
    )
    return out

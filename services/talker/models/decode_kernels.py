"""Triton kernels for a decode step's attention on CUDA: what lies between a layer's QKV projection and its output
projection, in two launches instead of eight.

A decode step is bound by the number of kernels it launches, not by arithmetic: at batch 1 the compiled layer
spent ~13 µs per layer in q/k norm, rotation, the stack and transpose of keys and values, the cache scatter and the
three attention kernels. Here:

- `qk_norm_rope_store`: one program per (row, token) RMS-normalises all its query and key heads with their norm
  weights, rotates them (NeoX halves, angles from the row's position, one cos and sin per dimension for all heads)
  and writes keys and values straight into the row's cache at that position; queries come back in
  `[B, heads, T, D]`. With a program per head instead (32 a row at 0.6B), a talker step took 7.55–7.75 against
  6.80–6.88 ms at batch 256 and 4.72 against 4.58–4.68 at 64 (0.6B, one H100, two rounds alternating in one call:
  bench/results/talker-20261127-163831 and -163939 against -163757 and -163904). Those one-warp programs, 8,192 a
  call at 256 rows, took 1.14 ms of a 6.95 ms step in the kernel profile (kernels-20261127-163210). Splitting a
  row's heads four to a program below 32 rows left batch 1 where it was (3.43–3.44 against 3.42–3.45 ms a step,
  -165003 and -165059 against -165032 and -165131) and a launch for one row at 1.56 µs against 1.59 whole (1.47
  per head): not worth a second way.
- `decode_attention`: one program per (row, key head) attends the few queries of that head group (1 or 2 tokens
  per row) over the row's cached keys, reading only positions up to the row's own — the cache length is an upper
  bound, not the work done. A block's keys and values are asked for together and the loop over blocks is
  software-pipelined, so the next block is on its way while this one is used: at batch 64, 12.2 against 14.3 µs a
  launch with rows at positions 20–145 and 44.8 against 60.4 at 20–1000 where the blocks came one after another,
  values after scores; a talker step 4.13 against 4.28 ms (bench/decode_attention_probe.py, whose docstring has the
  figures and what splitting a row's blocks over programs cost).

The cache is paged: `[2, blocks, kv_heads, block_size, D]`, and a row's position p lives in block
`block_table[row, p // block_size]` at offset `p % block_size`, so streams share one pool of blocks instead of each
holding the longest request's worth. A cache of one block per row (`block_table[row] = [row]`) is the unpaged case.

Both compute in fp32 and round where the compiled PyTorch path rounds (normalised values and cos/sin to the
activation dtype before scaling), so replacing it changes results only at bf16 rounding level.
Both launch with programmatic dependent launch where the GPU has it (see `pdl`).

One kernel for both (norm, rotation and cache write inside the attention's programs, one per row and key head) was
measured and left out: with PDL a launch costs little, while the fused kernel did the norm work in 8 programs a row
instead of 32 and read its fresh keys back after a barrier. A step took 3.65 against 3.59 ms at batch 1 and 4.97
against 4.86 at 64 (0.6B on one H100, two rounds in one call: commit 78f1975, bench/results/talker-20261126-180000
and -180138, against e1d7836 with these two kernels back — the code here — labelled e1d7836-noattn, -175921, -180106).
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
def _qk_norm_rope_store_kernel(
    qkv_ptr,
    q_norm_ptr,
    k_norm_ptr,
    positions_ptr,
    q_out_ptr,
    cache_ptr,
    table_ptr,
    stride_qkv_row,
    stride_qkv_token,
    stride_q_row,
    stride_q_head,
    stride_q_token,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_head,
    stride_cache_position,
    stride_table_row,
    num_tokens,
    eps,
    log2_theta,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    ALL_HEADS: tl.constexpr,  # query, key and value heads, rounded up to a power of two
    PDL: tl.constexpr,
):
    wait_for_previous_kernel(PDL)
    let_next_kernel_start(PDL)  # one program a row, and the attention after them has nothing to read before it waits
    row_token = tl.program_id(0)
    row = row_token // num_tokens
    token = row_token % num_tokens
    heads = tl.arange(0, ALL_HEADS)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    half = HEAD_DIM // 2
    partner = (dims + half) % HEAD_DIM
    is_query = heads < NUM_HEADS
    is_key = (heads >= NUM_HEADS) & (heads < NUM_HEADS + NUM_KV_HEADS)
    is_value = (heads >= NUM_HEADS + NUM_KV_HEADS) & (heads < NUM_HEADS + 2 * NUM_KV_HEADS)
    source = qkv_ptr + row * stride_qkv_row + token * stride_qkv_token + heads * HEAD_DIM
    exists = is_query | is_key | is_value
    x = tl.load(source + dims, mask=exists, other=0.0)
    x_partner = tl.load(source + partner, mask=exists, other=0.0).to(tl.float32)
    position = tl.load(positions_ptr + row_token)
    block = tl.load(table_ptr + row * stride_table_row + position // BLOCK_SIZE).to(tl.int64)
    slot = cache_ptr + block * stride_cache_block + (position % BLOCK_SIZE) * stride_cache_position
    dtype = qkv_ptr.dtype.element_ty
    # RMS norm per head in fp32, rounded to the activation dtype, then scaled by the head's norm weight.
    x_fp32 = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x_fp32 * x_fp32, axis=1) / HEAD_DIM + eps)[:, None]
    weight = tl.where(is_query, tl.load(q_norm_ptr + dims), tl.load(k_norm_ptr + dims)).to(tl.float32)
    weight_partner = tl.where(is_query, tl.load(q_norm_ptr + partner), tl.load(k_norm_ptr + partner))
    normed = (x_fp32 * inv_rms).to(dtype).to(tl.float32) * weight
    normed_partner = (x_partner * inv_rms).to(dtype).to(tl.float32) * weight_partner.to(tl.float32)
    # NeoX rotation: the first half pairs with the second; angle_i = position · theta^(-2 (i mod half) / D), one
    # cos and sin per dimension for every head of the row.
    inv_freq = tl.exp2(-((dims % half) * 2).to(tl.float32) / HEAD_DIM * log2_theta)
    angle = position.to(tl.float32) * inv_freq
    cos = tl.cos(angle).to(dtype).to(tl.float32)
    sin = tl.sin(angle).to(dtype).to(tl.float32)
    rotated = (normed * cos + tl.where(dims < half, -normed_partner, normed_partner) * sin).to(dtype)
    query_target = q_out_ptr + row * stride_q_row + heads * stride_q_head + token * stride_q_token + dims
    tl.store(query_target, rotated, mask=is_query)
    tl.store(slot + (heads - NUM_HEADS) * stride_cache_head + dims, rotated, mask=is_key)
    value_slot = slot + stride_cache_kv + (heads - NUM_HEADS - NUM_KV_HEADS) * stride_cache_head
    tl.store(value_slot + dims, x, mask=is_value)  # a value head: stored as it is


def qk_norm_rope_store(
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
    """Rotated, normalised queries `[B, heads, T, D]` of `qkv [B, T, (heads + 2 kv_heads) D]`; keys and values
    go into the paged `kv_cache [2, blocks, kv_heads, block_size, D]` at `positions [B, T]` of each row's blocks
    (`block_table [B, blocks per row]`)."""
    batch, num_tokens, _ = qkv.shape
    _, _, num_kv_heads, block_size, head_dim = kv_cache.shape
    assert qkv.stride(2) == 1 and kv_cache.stride(4) == 1 and positions.is_contiguous() and block_table.stride(1) == 1
    queries = qkv.new_empty(batch, num_heads, num_tokens, head_dim)
    uses_pdl = pdl.enabled(qkv)
    all_heads = triton.next_power_of_2(num_heads + 2 * num_kv_heads)
    _qk_norm_rope_store_kernel[(batch * num_tokens,)](
        qkv,
        q_norm_weight,
        k_norm_weight,
        positions,
        queries,
        kv_cache,
        block_table,
        *qkv.stride()[:2],
        *queries.stride()[:3],
        *kv_cache.stride()[:4],
        block_table.stride(0),
        num_tokens,
        eps,
        math.log2(rope_theta),
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        ALL_HEADS=all_heads,
        PDL=uses_pdl,
        num_warps=4,
        launch_pdl=uses_pdl,
    )
    return queries


@triton.jit
def _attend_block(
    q,
    keys_ptr,
    values_ptr,
    offsets,
    key,
    query_position,
    last_position,
    running_max,
    running_sum,
    acc,
    scale,
    PRECISION: tl.constexpr,
):
    """The online softmax over one block of keys (`key`: their positions): the running max, sum and output."""
    is_written = key <= last_position
    k = tl.load(keys_ptr + offsets, mask=is_written[:, None], other=0.0)
    v = tl.load(values_ptr + offsets, mask=is_written[:, None], other=0.0)  # asked for with the keys: one wait, not two
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    scores = tl.where(key[None, :] <= query_position[:, None], scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    weights = tl.exp(scores - new_max[:, None])
    correction = tl.exp(running_max - new_max)
    running_sum = running_sum * correction + tl.sum(weights, axis=1)
    acc = acc * correction[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
    return new_max, running_sum, acc


@triton.jit
def _decode_attention_kernel(
    q_ptr,
    cache_ptr,
    table_ptr,
    positions_ptr,
    out_ptr,
    stride_q_row,
    stride_q_head,
    stride_q_token,
    stride_cache_kv,
    stride_cache_block,
    stride_cache_head,
    stride_cache_position,
    stride_table_row,
    stride_out_row,
    stride_out_token,
    num_tokens,
    scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_QUERIES: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    # Query rows of this key head: (group member g, token t) → g * T + t; padded to a tensor-core tile.
    query = tl.arange(0, BLOCK_QUERIES)
    is_query = query < GROUP * num_tokens
    member = query // num_tokens
    token = query % num_tokens
    head = kv_head * GROUP + member
    dims = tl.arange(0, HEAD_DIM)
    # Read before the wait: positions come from the host or from a kernel long done. The kernel before this one
    # (`qk_norm_rope_store`) lets it start only after its own wait, when every kernel before that one has ended.
    query_position = tl.load(positions_ptr + row * num_tokens + token, mask=is_query, other=0)
    last_position = tl.max(query_position, axis=0)
    wait_for_previous_kernel(PDL)
    q_offsets = row * stride_q_row + head * stride_q_head + token * stride_q_token
    q = tl.load(q_ptr + q_offsets[:, None] + dims[None, :], mask=is_query[:, None], other=0.0)
    running_max = tl.full([BLOCK_QUERIES], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_QUERIES], tl.float32)
    acc = tl.zeros([BLOCK_QUERIES, HEAD_DIM], tl.float32)
    offset = tl.arange(0, BLOCK_SIZE)
    offsets = offset[:, None] * stride_cache_position + dims[None, :]
    head_ptr = cache_ptr + kv_head * stride_cache_head
    if NUM_BLOCKS == 1:  # the code predictor's cache: one block, straight through
        keys_ptr = head_ptr + tl.load(table_ptr + row * stride_table_row).to(tl.int64) * stride_cache_block
        running_max, running_sum, acc = _attend_block(
            q,
            keys_ptr,
            keys_ptr + stride_cache_kv,
            offsets,
            offset,
            query_position,
            last_position,
            running_max,
            running_sum,
            acc,
            scale,
            PRECISION,
        )
    else:
        # Only the blocks up to the row's last position are read; software-pipelined, so the next block's keys
        # and values are on their way while this one's are used.
        for index in tl.range(0, last_position // BLOCK_SIZE + 1, num_stages=2):
            block = tl.load(table_ptr + row * stride_table_row + index).to(tl.int64)
            keys_ptr = head_ptr + block * stride_cache_block
            running_max, running_sum, acc = _attend_block(
                q,
                keys_ptr,
                keys_ptr + stride_cache_kv,
                offsets,
                index * BLOCK_SIZE + offset,
                query_position,
                last_position,
                running_max,
                running_sum,
                acc,
                scale,
                PRECISION,
            )
    let_next_kernel_start(PDL)
    out = acc / running_sum[:, None]
    out_offsets = row * stride_out_row + token * stride_out_token + head * HEAD_DIM
    tl.store(out_ptr + out_offsets[:, None] + dims[None, :], out.to(q.dtype), mask=is_query[:, None])


def decode_attention(
    queries: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Attention output `[B, T, heads * D]` of `queries [B, heads, T, D]` over the paged `kv_cache [2, blocks,
    kv_heads, block_size, D]` (row i's blocks: `block_table[i]`): each query attends the keys at positions ≤ its own
    (`positions [B, T]`)."""
    batch, num_heads, num_tokens, head_dim = queries.shape
    _, _, num_kv_heads, block_size, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    assert block_table.stride(1) == 1
    out = queries.new_empty(batch, num_tokens, num_heads * head_dim)
    uses_pdl = pdl.enabled(queries)
    _decode_attention_kernel[(batch, num_kv_heads)](
        queries,
        kv_cache,
        block_table,
        positions,
        out,
        *queries.stride()[:3],
        *kv_cache.stride()[:4],
        block_table.stride(0),
        *out.stride()[:2],
        num_tokens,
        head_dim**-0.5,
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_QUERIES=16,
        NUM_BLOCKS=block_table.shape[1],
        BLOCK_SIZE=block_size,
        PRECISION=_DOT_PRECISION[queries.dtype],
        PDL=uses_pdl,
        num_warps=4,
        launch_pdl=uses_pdl,
    )
    return out

"""`python bench/decode_attention_probe.py [OUT.json]` on a CUDA GPU: how long the talker's decode attention takes
at a decode step's shapes, for the committed kernel and other ways of walking a row's cached blocks.

An experiment kept for its answer, not a serving path. A 0.6B step at batch 64 spent 0.80 of its 4.6 ms of kernel
time in 103 attention launches (bench/results/kernels-20261127-191945): 28 over the talker's cache (a row's
positions in blocks of 64) and 75 over the code predictor's (one block of 16). Candidates:
  committed    `decode_kernels.decode_attention`: a block's keys and values asked for together, the loop bounded by
               the row's last position and software-pipelined, so the next block's loads are in flight while this
               one's are used; the predictor's one block straight through
  sequential   3c82bca's kernel: blocks one after another, a block's values asked for only after its scores (two
               trips to HBM in turn), the loop over every block of the table with the unwritten ones skipped
  splitN       flash-decoding inside one launch: N programs a row and key head share its blocks, and the last to
               finish (an atomic count) merges their partial outputs
Each case replays a CUDA graph of a chain of launches as in a step (28 layers of distinct caches for the talker, 5
layers × 15 codebooks for the predictor) and prints µs a launch and the largest difference from the committed
kernel's output.

Answer (H200, bench/results/decode-attention-20261128-1711.json, the committed kernel as the probe's "pipelined"
candidate then): µs a launch, committed / sequential: 64 rows at positions 20–145 12.2 / 14.3, all at 150 17.7 /
21.6, all at 40 (one block) 7.0 / 6.6, positions 20–1000 44.8 / 60.4, 256 rows at 20–145 31.9 / 38.4, one row at 100
3.6 / 4.6, the predictor 3.25 / 3.17 through the pipelined loop (which is why its single block now goes
straight through; not timed alone since). Splitting was slower everywhere (split4 33.8 µs at
64 rows 20–145, split2 18.8; at 20–1000 split2 48.7): a row's few blocks give each program too little to read, and
the merge's extra reads and its fp32 partials cost more than the parallelism gains. The talker engine at batch 64:
4.13 against 4.28–4.29 ms a step (1203–1204 against 1146–1152 audio-s/s; bench/results/talker-20261128-171625 …
-171739, alternating in one call).
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from chorus.talker.models import decode_kernels, pdl
from chorus.talker.models.pdl import let_next_kernel_start, wait_for_previous_kernel

ROWS = 64
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
REPLAYS = 50


@triton.jit
def _sequential_kernel(
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
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    # Query rows of this key head: (group member g, token t) → g * T + t; padded to a tensor-core tile.
    query = tl.arange(0, BLOCK_QUERIES)
    is_query = query < GROUP * num_tokens
    member = query // num_tokens
    token = query % num_tokens
    head = kv_head * GROUP + member
    dims = tl.arange(0, HEAD_DIM)
    q_offsets = row * stride_q_row + head * stride_q_head + token * stride_q_token
    q = tl.load(q_ptr + q_offsets[:, None] + dims[None, :], mask=is_query[:, None], other=0.0)
    query_position = tl.load(positions_ptr + row * num_tokens + token, mask=is_query, other=0)
    last_position = tl.max(query_position, axis=0)
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
    tl.store(out_ptr + out_offsets[:, None] + dims[None, :], out.to(q.dtype), mask=is_query[:, None])


def sequential(queries, kv_cache, block_table, positions):
    """3c82bca's `decode_attention`."""
    batch, num_heads, num_tokens, head_dim = queries.shape
    _, _, num_kv_heads, block_size, _ = kv_cache.shape
    out = queries.new_empty(batch, num_tokens, num_heads * head_dim)
    uses_pdl = pdl.enabled(queries)
    _sequential_kernel[(batch, num_kv_heads)](
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
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_QUERIES=16,
        NUM_BLOCKS=block_table.shape[1],
        BLOCK_SIZE=block_size,
        PRECISION="tf32" if queries.dtype != torch.float32 else "ieee",
        PDL=uses_pdl,
        num_warps=4,
        launch_pdl=uses_pdl,
    )
    return out


@triton.jit
def _split_kernel(
    q_ptr,
    cache_ptr,
    table_ptr,
    positions_ptr,
    out_ptr,
    partial_ptr,
    stats_ptr,
    counter_ptr,
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
    BLOCK_SIZE: tl.constexpr,
    SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)
    query = tl.arange(0, BLOCK_QUERIES)
    is_query = query < GROUP * num_tokens
    member = query // num_tokens
    token = query % num_tokens
    head = kv_head * GROUP + member
    dims = tl.arange(0, HEAD_DIM)
    query_position = tl.load(positions_ptr + row * num_tokens + token, mask=is_query, other=0)
    last_position = tl.max(query_position, axis=0)
    num_live = last_position // BLOCK_SIZE + 1
    if split < num_live:  # a split past the row's blocks has nothing to read or write
        wait_for_previous_kernel(PDL)
        q_offsets = row * stride_q_row + head * stride_q_head + token * stride_q_token
        q = tl.load(q_ptr + q_offsets[:, None] + dims[None, :], mask=is_query[:, None], other=0.0)
        running_max = tl.full([BLOCK_QUERIES], float("-inf"), tl.float32)
        running_sum = tl.zeros([BLOCK_QUERIES], tl.float32)
        acc = tl.zeros([BLOCK_QUERIES, HEAD_DIM], tl.float32)
        offset = tl.arange(0, BLOCK_SIZE)
        for index in tl.range(split, num_live, SPLITS, num_stages=NUM_STAGES):
            block = tl.load(table_ptr + row * stride_table_row + index).to(tl.int64)
            keys_ptr = cache_ptr + block * stride_cache_block + kv_head * stride_cache_head
            key = index * BLOCK_SIZE + offset
            is_written = key <= last_position
            offsets = offset[:, None] * stride_cache_position + dims[None, :]
            k = tl.load(keys_ptr + offsets, mask=is_written[:, None], other=0.0)
            v = tl.load(keys_ptr + stride_cache_kv + offsets, mask=is_written[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            scores = tl.where(key[None, :] <= query_position[:, None], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_max[:, None])
            correction = tl.exp(running_max - new_max)
            running_sum = running_sum * correction + tl.sum(weights, axis=1)
            acc = acc * correction[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            running_max = new_max
        let_next_kernel_start(PDL)
        out_offsets = row * stride_out_row + token * stride_out_token + head * HEAD_DIM
        num_splits = tl.minimum(num_live, SPLITS)
        if num_splits == 1:
            out = acc / running_sum[:, None]
            tl.store(out_ptr + out_offsets[:, None] + dims[None, :], out.to(q.dtype), mask=is_query[:, None])
        else:
            # This split's share, then the last split of the row and head to finish merges them all.
            pair = row * num_kv_heads + kv_head
            base = (pair * SPLITS + split) * BLOCK_QUERIES
            tl.store(partial_ptr + (base + query)[:, None] * HEAD_DIM + dims[None, :], acc, mask=is_query[:, None])
            tl.store(stats_ptr + 2 * (base + query), running_max, mask=is_query)
            tl.store(stats_ptr + 2 * (base + query) + 1, running_sum, mask=is_query)
            tl.debug_barrier()
            finished = tl.atomic_add(counter_ptr + pair, 1, sem="acq_rel")
            if finished == num_splits - 1:
                tl.atomic_xchg(counter_ptr + pair, 0)  # ready for the next call
                splits = tl.arange(0, SPLITS)
                is_split = splits < num_splits
                slots = (pair * SPLITS + splits[:, None]) * BLOCK_QUERIES + query[None, :]  # [SPLITS, QUERIES]
                valid = is_split[:, None] & is_query[None, :]
                maxima = tl.load(stats_ptr + 2 * slots, mask=valid, other=float("-inf"))
                sums = tl.load(stats_ptr + 2 * slots + 1, mask=valid, other=0.0)
                overall = tl.max(maxima, axis=0)
                factors = tl.where(valid, tl.exp(maxima - overall[None, :]), 0.0)
                total = tl.sum(sums * factors, axis=0)
                shares = tl.load(
                    partial_ptr + slots[:, :, None] * HEAD_DIM + dims[None, None, :], mask=valid[:, :, None], other=0.0
                )
                merged = tl.sum(shares * factors[:, :, None], axis=0) / total[:, None]
                tl.store(out_ptr + out_offsets[:, None] + dims[None, :], merged.to(q.dtype), mask=is_query[:, None])


_COUNTERS = {}


def split(queries, kv_cache, block_table, positions, splits=4, num_stages=2, num_warps=4):
    batch, num_heads, num_tokens, head_dim = queries.shape
    _, _, num_kv_heads, block_size, _ = kv_cache.shape
    out = queries.new_empty(batch, num_tokens, num_heads * head_dim)
    partial = torch.empty(batch * num_kv_heads * splits * 16, head_dim, device=queries.device, dtype=torch.float32)
    stats = torch.empty(batch * num_kv_heads * splits * 16, 2, device=queries.device, dtype=torch.float32)
    key = (queries.device, batch * num_kv_heads)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(batch * num_kv_heads, device=queries.device, dtype=torch.int32)
    uses_pdl = pdl.enabled(queries)
    _split_kernel[(batch, num_kv_heads, splits)](
        queries,
        kv_cache,
        block_table,
        positions,
        out,
        partial,
        stats,
        _COUNTERS[key],
        *queries.stride()[:3],
        *kv_cache.stride()[:4],
        block_table.stride(0),
        *out.stride()[:2],
        num_tokens,
        head_dim**-0.5,
        GROUP=num_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_QUERIES=16,
        BLOCK_SIZE=block_size,
        SPLITS=splits,
        PRECISION="tf32" if queries.dtype != torch.float32 else "ieee",
        NUM_STAGES=num_stages,
        PDL=uses_pdl,
        num_warps=num_warps,
        launch_pdl=uses_pdl,
    )
    return out


CANDIDATES = {
    "committed": decode_kernels.decode_attention,
    "sequential": sequential,
    "split2": lambda *a: split(*a, splits=2),
    "split4": lambda *a: split(*a, splits=4),
    "split4_unpipelined": lambda *a: split(*a, splits=4, num_stages=1),
}


def _chain(layers: list[tuple], function) -> torch.cuda.CUDAGraph:
    """A graph of one launch per layer (`layers`: queries, cache, table, positions)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in layers:  # compile and warm outside the capture
            function(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in layers:
            function(*args)
    return graph


def _time_us(graph: torch.cuda.CUDAGraph, launches: int) -> float:
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / REPLAYS / launches


def _talker_layers(positions: torch.Tensor, generator: torch.Generator) -> list[tuple]:
    """28 layers, each a pool of its own holding every row's blocks in a random order."""
    block_size, rows = 64, len(positions)
    per_row = int(positions.max()) // block_size + 1
    layers = []
    for _ in range(28):
        num_blocks = 1 + rows * per_row
        table = (torch.randperm(num_blocks - 1, generator=generator) + 1).view(rows, per_row).int().cuda()
        cache = torch.randn(2, num_blocks, KV_HEADS, block_size, HEAD_DIM, generator=generator).bfloat16().cuda()
        queries = torch.randn(rows, HEADS, 1, HEAD_DIM, generator=generator).bfloat16().cuda()
        layers.append((queries, cache, table, positions.view(rows, 1).int().cuda()))
    return layers


def _predictor_layers(generator: torch.Generator) -> list[tuple]:
    """5 layers × 15 codebooks over one block of 16 positions a row; the first codebook's forward feeds 2 tokens."""
    caches = [torch.randn(2, ROWS, KV_HEADS, 16, HEAD_DIM, generator=generator).bfloat16().cuda() for _ in range(5)]
    table = torch.arange(ROWS, dtype=torch.int32).cuda()[:, None]
    layers = []
    for codebook in range(1, 16):
        tokens = 2 if codebook == 1 else 1
        positions = torch.arange(tokens).repeat(ROWS, 1) if tokens == 2 else torch.full((ROWS, 1), codebook)
        for cache in caches:
            queries = torch.randn(ROWS, HEADS, tokens, HEAD_DIM, generator=generator).bfloat16().cuda()
            layers.append((queries, cache, table, positions.int().cuda()))
    return layers


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    cases = {
        "talker_mixed_20_145": _talker_layers(torch.randint(20, 146, (ROWS,), generator=generator), generator),
        "talker_all_at_150": _talker_layers(torch.full((ROWS,), 150), generator),
        "talker_all_at_40": _talker_layers(torch.full((ROWS,), 40), generator),
        "predictor": _predictor_layers(generator),
        "talker_256_rows_mixed_20_145": _talker_layers(torch.randint(20, 146, (256,), generator=generator), generator),
        "talker_1_row_at_100": _talker_layers(torch.full((1,), 100), generator),
        "talker_64_rows_mixed_20_1000": _talker_layers(
            torch.randint(20, 1001, (ROWS,), generator=generator), generator
        ),
    }
    results = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "cases": {}}
    for case, layers in cases.items():
        expected = [decode_kernels.decode_attention(*args) for args in layers]
        row = {}
        for name, function in CANDIDATES.items():
            difference = max(
                float((function(*args) - want).abs().max()) for args, want in zip(layers, expected, strict=True)
            )
            row[name] = {
                "us_per_launch": round(_time_us(_chain(layers, function), len(layers)), 2),
                "max_abs_difference": difference,
            }
        for name, function in CANDIDATES.items():  # a second round: the order's effect
            row[name]["us_per_launch_again"] = round(_time_us(_chain(layers, function), len(layers)), 2)
        results["cases"][case] = row
        print(case, json.dumps(row), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as file:
            json.dump(results, file, indent=2)


if __name__ == "__main__":
    main()

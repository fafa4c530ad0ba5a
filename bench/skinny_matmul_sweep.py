"""`python bench/skinny_matmul_sweep.py` on a GPU: would a Triton matmul for a decode step's few rows beat cuBLAS?

An experiment kept for its answer, not a serving path. A 0.6B frame multiplies 1–64 rows by four weight matrices in
each of 103 layers (the talker's 28, the code predictor's 5 for each of 15 codebooks); the profile (`python -m
chorus.bench.kernels`) puts ~3 of the step's ~4.3 ms there, far from what reading the weights costs. The kernel
here cuts the output columns into `block_n` tiles and, where that leaves SMs idle, the depth into `split_k` slices
summed in order by a second kernel; rows are tiled 16 at a time so a row's result is batch-size independent. For
the 0.6B shapes (QKV 1024→4096, output 2048→1024, gate/up 1024→6144, down 3072→1024) at 1 and 64 rows (`--rows`)
it times `F.linear` (cuBLAS), the plan `plan_for` picks, and a grid of plans, each the median of CUDA-graph replays
(`triton.testing.do_bench_cudagraph`: launch overhead as in a decode step; weights read from HBM, not L2). Writes
`bench/results/skinny-matmul-<stamp>.json` (device, commit); the per-frame figure is the four shapes × 103 layers.

Answer (H100, bench/results/skinny-matmul-20261126-044453): no. cuBLAS takes 5.7–8.5 µs a matmul, 2.71 ms a frame at
1 row and 2.83 ms at 64; the best plan of the grid for each shape, chosen after the fact, 2.49 and 3.13 ms, and
`plan_for`'s 2.98 and 6.53 ms. Wired into the talker (chorus::skinny_linear in every decode layer) it made the
engine bench slower (5.09 → 8.46 ms a step at batch 64). These matmuls are bound by per-kernel latency (a few µs
to fill the memory pipeline), not by the tiling: fewer kernels, not other ones, is what would pay.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from chorus.bench.report import REPO, commit

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
L2_FLUSH_BYTES = 256 << 20
LAYERS_PER_FRAME = 103  # 0.6B: the talker's 28 + the code predictor's 5 × 15 codebooks


BLOCK_M = 16  # the smallest tensor-core row tile; fixed so a row's result is batch-size independent
PROGRAMS_PER_SM = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 4


@functools.cache
def plan_for(num_cols: int, depth: int, num_sms: int) -> Plan:
    """Tiles for a `[rows, depth] @ [depth, num_cols]` product: the widest column tile (of 64, 32, 16) and then the
    fewest depth slices (powers of two, each a whole number of `block_k` steps) that give every SM
    `PROGRAMS_PER_SM` programs."""
    target = PROGRAMS_PER_SM * num_sms
    block_k = 128 if depth % 128 == 0 else 64
    for block_n in (64, 32, 16):
        if triton.cdiv(num_cols, block_n) >= target:
            return Plan(block_n, block_k, 1)
    block_n = 16
    tiles = triton.cdiv(num_cols, block_n)
    split_k = 1
    while tiles * split_k < target and depth % (2 * split_k * block_k) == 0:
        split_k *= 2
    return Plan(block_n, block_k, split_k)


@triton.jit
def _skinny_matmul_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    num_rows,
    num_cols,
    depth_per_split,
    stride_x,
    stride_w,
    stride_out_split,
    stride_out,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    col_tile, split, row_tile = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = col_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    in_rows, in_cols = rows < num_rows, cols < num_cols
    start = split * depth_per_split
    x_tile = x_ptr + rows[:, None] * stride_x + (start + ks)[None, :]
    w_tile = w_ptr + cols[:, None] * stride_w + (start + ks)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, depth_per_split, BLOCK_K):
        x = tl.load(x_tile, mask=in_rows[:, None], other=0.0)
        w = tl.load(w_tile, mask=in_cols[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_tile += BLOCK_K
        w_tile += BLOCK_K
    out = out_ptr + split * stride_out_split + rows[:, None] * stride_out + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=in_rows[:, None] & in_cols[None, :])


@triton.jit
def _sum_splits_kernel(partial_ptr, out_ptr, num_elements, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < num_elements
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):  # in slice order: the same sum every time
        total += tl.load(partial_ptr + split * num_elements + offsets, mask=inside, other=0.0)
    tl.store(out_ptr + offsets, total.to(out_ptr.dtype.element_ty), mask=inside)


def launch(rows: torch.Tensor, weight: torch.Tensor, plan: Plan) -> torch.Tensor:
    """`rows [M, K] @ weight[N, K].T` by `plan` (any device Triton runs on, the interpreter included)."""
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    (num_rows, depth), num_cols = rows.shape, weight.shape[0]
    out = rows.new_empty(num_rows, num_cols)
    target = out if plan.split_k == 1 else out.new_empty(plan.split_k, num_rows, num_cols, dtype=torch.float32)
    grid = (triton.cdiv(num_cols, plan.block_n), plan.split_k, triton.cdiv(num_rows, BLOCK_M))
    _skinny_matmul_kernel[grid](
        rows,
        weight,
        target,
        num_rows,
        num_cols,
        depth // plan.split_k,
        rows.stride(0),
        weight.stride(0),
        target.stride(0) if plan.split_k > 1 else 0,
        num_cols,
        BLOCK_M=BLOCK_M,
        BLOCK_N=plan.block_n,
        BLOCK_K=plan.block_k,
        num_warps=plan.num_warps,
        num_stages=plan.num_stages,
    )
    if plan.split_k > 1:
        block = 1024
        _sum_splits_kernel[(triton.cdiv(out.numel(), block),)](
            target, out, out.numel(), SPLIT_K=plan.split_k, BLOCK=block
        )
    return out


def _time_us(fn) -> float:
    return do_bench_cudagraph(fn, rep=30) * 1000


def _grid(depth: int) -> list[Plan]:
    plans = []
    for block_n, block_k, split_k, num_warps, num_stages in itertools.product(
        (16, 32, 64), (64, 128, 256), (1, 2, 4, 8), (2, 4), (4,)
    ):
        if depth % (split_k * block_k) == 0:
            plans.append(Plan(block_n, block_k, split_k, num_warps, num_stages))
    return plans


def _measure(name: str, cols: int, depth: int, rows: int, num_sms: int, grid: bool) -> dict:
    x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    # Successive calls read different copies of the weight, more than L2 holds: in a decode step every layer's
    # weights come from HBM, and so they do here.
    copies = -(-L2_FLUSH_BYTES // (cols * depth * 2))
    weights = [torch.randn(cols, depth, device="cuda", dtype=torch.bfloat16) / depth**0.5 for _ in range(copies)]
    turns = itertools.cycle(weights)
    chosen = plan_for(cols, depth, num_sms)
    entry = {
        "shape": name,
        "rows": rows,
        "cols": cols,
        "depth": depth,
        "cublas_us": _time_us(lambda: F.linear(x, next(turns))),
        "chosen": vars_of(chosen),
        "chosen_us": _time_us(lambda: launch(x, next(turns), chosen)),
    }
    if grid:
        timed = [(_time_us(lambda plan=plan: launch(x, next(turns), plan)), plan) for plan in _grid(depth)]
        best_us, best = min(timed, key=lambda pair: pair[0])
        entry.update(best=vars_of(best), best_us=best_us)
    entry["weight_gb_per_s"] = cols * depth * 2 / (entry["chosen_us"] * 1e3)
    print(
        f"{name:8} rows {rows:3}: cuBLAS {entry['cublas_us']:6.1f} µs, chosen {entry['chosen_us']:6.1f} µs "
        f"({entry['weight_gb_per_s']:5.0f} GB/s)"
        + (f", best {entry['best_us']:6.1f} µs {entry['best']}" if grid else "")
    )
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,64")
    parser.add_argument("--no-grid", action="store_true", help="only cuBLAS and the chosen plan")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    device = torch.device("cuda")
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    shapes = itertools.product(SHAPES.items(), [int(r) for r in args.rows.split(",")])
    results = [_measure(name, cols, depth, rows, num_sms, not args.no_grid) for (name, (cols, depth)), rows in shapes]
    per_frame = {}
    for rows in sorted({entry["rows"] for entry in results}):
        at = [entry for entry in results if entry["rows"] == rows]
        per_frame[rows] = {
            key: round(sum(entry[f"{key}_us"] for entry in at) * LAYERS_PER_FRAME / 1000, 3)
            for key in ("cublas", "chosen", "best")
            if all(f"{key}_us" in entry for entry in at)
        }
        print(f"per 0.6B frame at {rows} rows (ms): {per_frame[rows]}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"skinny-matmul-{stamp}.json"
    report = {
        "benchmark": "skinny-matmul",
        "commit": commit(),
        "device": torch.cuda.get_device_name(device),
        "results": results,
        "ms_per_frame": per_frame,
    }
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")


def vars_of(plan: Plan) -> dict:
    return {field: getattr(plan, field) for field in Plan.__dataclass_fields__}


if __name__ == "__main__":
    main()

"""`python bench/few_rows_matmul_sweep.py` on a GPU: which fixed block sizes should `few_rows_matmul` use?

An experiment kept for its answer, not a serving path. A 0.6B decode step at batch 1 runs `few_rows_matmul` four
times in each of 103 layers (the talker's 28, the code predictor's 5 for each of 15 codebooks): QKV with the input
norm, output with the residual add, gate-up with the norm and SwiGLU, down with the residual add, each reading the
one before's output. This builds that chain with 103 layers' own weights (3.2 GB in bf16, so weights come from HBM
as in a step), captures it in one CUDA graph per candidate (BLOCK_N, BLOCK_K, warps), with and without programmatic
dependent launch, and times graph replays: µs a frame for the whole chain and for each projection's 103 launches
alone. Writes `bench/results/few-rows-matmul-<stamp>.json` (device, commit).

Answer (H100, 8aa95fb, bench/results/few-rows-matmul-20261126-155559, one row): the fixed sizes stay. BLOCK_N 4,
BLOCK_K 1024 and 4 warps (the committed ones) ran the chain in 2.595 ms with PDL, 2.720 without; the fastest of the
18 candidates, 2 warps, in 2.566 / 2.687 (1 % less), and the engine bench with it was no faster (3.727 against 3.695
ms a step at batch 1, 4.004 against 4.037 at batch 2, `talker-20261126-155703` against `-155736`). Larger column
blocks and smaller depth blocks were slower, up to 4.2 ms. The chain spends ~6.3 µs a launch where reading the
weights at full HBM bandwidth would take ~2.4: what is left is per-kernel latency, which another tiling does not
remove.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from chorus.bench.report import REPO, commit
from chorus.talker.models.few_rows_matmul import launch

HIDDEN, HEADS_DIM, INTERMEDIATE, LAYERS = 1024, 2048, 3072, 103
EPS = 1e-6


def project(x, weight, out, config, pdl, norm=None, residual=None, swiglu=False):
    launch(x, weight, out, norm, EPS, swiglu, residual, *config, pdl)


class Chain:
    """103 layers' projections and the buffers a frame's chain of launches reads and writes."""

    def __init__(self, num_rows: int) -> None:
        def weight(rows, cols):
            return torch.randn(LAYERS, rows, cols, device="cuda", dtype=torch.bfloat16) * cols**-0.5

        self.qkv, self.o = weight(4096, HIDDEN), weight(HIDDEN, HEADS_DIM)
        self.gate_up, self.down = weight(2 * INTERMEDIATE, HIDDEN), weight(HIDDEN, INTERMEDIATE)
        self.norm = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)

        def buffer(cols):
            return torch.randn(num_rows, cols, device="cuda", dtype=torch.bfloat16)

        self.x, self.qkv_out, self.attended = buffer(HIDDEN), buffer(4096), buffer(HEADS_DIM)
        self.after_attention, self.activations, self.out = buffer(HIDDEN), buffer(INTERMEDIATE), buffer(HIDDEN)

    def run(self, config, pdl, only: str | None = None) -> None:
        for layer in range(LAYERS):
            if only in (None, "qkv"):
                project(self.x, self.qkv[layer], self.qkv_out, config, pdl, norm=self.norm)
            if only in (None, "o"):
                project(self.attended, self.o[layer], self.after_attention, config, pdl, residual=self.x)
            if only in (None, "gate_up"):
                gate_up = self.gate_up[layer]
                project(self.after_attention, gate_up, self.activations, config, pdl, self.norm, swiglu=True)
            if only in (None, "down"):
                project(self.activations, self.down[layer], self.out, config, pdl, residual=self.after_attention)


def time_graph(chain: Chain, config, pdl: bool, only: str | None, replays: int) -> float:
    """µs a replay of the chain's graph, the median of `replays`."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        chain.run(config, pdl, only)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        chain.run(config, pdl, only)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--block-n", default="2,4,8,16")
    parser.add_argument("--block-k", default="512,1024")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    chain = Chain(args.rows)
    grid = itertools.product(*([int(v) for v in text.split(",")] for text in (args.block_n, args.block_k, args.warps)))
    results = []
    for config in grid:
        row = {"block_n": config[0], "block_k": config[1], "num_warps": config[2]}
        for pdl in (False, True):
            for only in (None, "qkv", "o", "gate_up", "down"):
                row[f"{'pdl' if pdl else 'plain'}_{only or 'chain'}_us"] = round(
                    time_graph(chain, config, pdl, only, args.replays), 1
                )
        results.append(row)
        print(json.dumps(row), flush=True)
    report = {
        "benchmark": "few-rows-matmul",
        "commit": commit(),
        "device": torch.cuda.get_device_name(),
        "rows": args.rows,
        "layers": LAYERS,
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"few-rows-matmul-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    for key in ("pdl_chain_us", "plain_chain_us"):
        best = min(results, key=lambda row: row[key])
        print(f"best {key}: {best}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

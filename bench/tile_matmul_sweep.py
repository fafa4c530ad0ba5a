"""`python bench/tile_matmul_sweep.py` on a GPU: is `tile_matmul` faster than cuBLAS plus compiled element-wise
kernels for a decode step's projections at 3–64 rows, and with which fixed block sizes?

An experiment kept for its answer, not a serving path. A 0.6B decode step runs four projections in each of 103
layers (the talker's 28, the code predictor's 5 for each of 15 codebooks). This builds that chain with 103 layers'
own weights (3.2 GB in bf16, so weights come from HBM as in a step) two ways and captures each in one CUDA graph:
`cublas`, the path decode steps of more than two rows take without `tile_matmul` (the QKV projection, then
`Qwen3DecoderLayer.output_and_mlp` compiled: cuBLAS products, the residual adds and norms and SwiGLU as compiled
kernels), and `tile` per candidate (BLOCK_N, BLOCK_K, warps, stages): four fused launches a layer. It times graph
replays (µs for the whole chain, median) and checks one layer's outputs against the cuBLAS path's. Writes
`bench/results/tile-matmul-<stamp>.json` (device, commit).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from chorus.bench.report import REPO, commit
from chorus.talker.models import pdl
from chorus.talker.models.qwen3_layers import rms_norm
from chorus.talker.models.tile_matmul import launch

HIDDEN, QKV, HEADS_DIM, INTERMEDIATE, LAYERS = 1024, 4096, 2048, 3072, 103
EPS = 1e-6


def output_and_mlp(x, attended, o, norm, gate_up, down):
    """`Qwen3DecoderLayer.output_and_mlp` with the layer's weights as arguments."""
    x = x + F.linear(attended, o)
    gate, up = F.linear(rms_norm(x, norm, EPS), gate_up).chunk(2, dim=-1)
    x = x + F.linear(F.silu(gate) * up, down)
    return x, rms_norm(x, norm, EPS)


class Chain:
    """103 layers' projections and the buffers a frame's chain of launches reads and writes."""

    def __init__(self, num_rows: int) -> None:
        def weight(rows, cols):
            return torch.randn(LAYERS, rows, cols, device="cuda", dtype=torch.bfloat16) * cols**-0.5

        self.qkv, self.o = weight(QKV, HIDDEN), weight(HIDDEN, HEADS_DIM)
        self.gate_up, self.down = weight(2 * INTERMEDIATE, HIDDEN), weight(HIDDEN, INTERMEDIATE)
        self.norm = torch.rand(HIDDEN, device="cuda", dtype=torch.bfloat16) + 0.5

        def buffer(cols):
            return torch.randn(num_rows, cols, device="cuda", dtype=torch.bfloat16)

        self.x, self.attended = buffer(HIDDEN), buffer(HEADS_DIM)
        self.normed = rms_norm(self.x, self.norm, EPS)  # the previous layer's output and next norm, in production
        self.qkv_out, self.after_attention = buffer(QKV), buffer(HIDDEN)
        self.activations, self.out = buffer(INTERMEDIATE), buffer(HIDDEN)
        self.compiled = torch.compile(output_and_mlp, dynamic=True, fullgraph=True)

    def run_cublas(self) -> tuple[torch.Tensor, ...]:
        for layer in range(LAYERS):
            qkv = F.linear(self.normed, self.qkv[layer])
            out, _ = self.compiled(
                self.x, self.attended, self.o[layer], self.norm, self.gate_up[layer], self.down[layer]
            )
        return qkv, out

    def run_tile(self, config) -> tuple[torch.Tensor, ...]:
        uses_pdl = pdl.enabled(self.x)
        for layer in range(LAYERS):
            launch(self.x, self.qkv[layer], self.qkv_out, self.norm, EPS, False, None, *config, uses_pdl)
            launch(self.attended, self.o[layer], self.after_attention, None, EPS, False, self.x, *config, uses_pdl)
            gate_up = self.gate_up[layer]
            launch(self.after_attention, gate_up, self.activations, self.norm, EPS, True, None, *config, uses_pdl)
            down = self.down[layer]
            launch(self.activations, down, self.out, None, EPS, False, self.after_attention, *config, uses_pdl)
        return self.qkv_out, self.out


def time_graph(run, replays: int) -> float:
    """µs a replay of `run`'s graph, the median of `replays`."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        run()
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


def max_difference(chain: Chain, config) -> float:
    """The largest |tile − cuBLAS path| over one layer's QKV and output rows, relative to the output's scale."""
    qkv, out = (t.float().clone() for t in chain.run_cublas())
    tile_qkv, tile_out = (t.float() for t in chain.run_tile(config))
    return max(
        float((tile_qkv - qkv).abs().max() / qkv.abs().max()), float((tile_out - out).abs().max() / out.abs().max())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="4,16,32,64")
    parser.add_argument("--block-n", default="16,32,64")
    parser.add_argument("--block-k", default="64,128,256")
    parser.add_argument("--warps", default="4")
    parser.add_argument("--stages", default="2,3,4")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    grid = list(
        itertools.product(
            *([int(v) for v in text.split(",")] for text in (args.block_n, args.block_k, args.warps, args.stages))
        )
    )
    results = []
    for num_rows in (int(v) for v in args.rows.split(",")):
        chain = Chain(num_rows)
        row = {"rows": num_rows, "cublas_chain_us": round(time_graph(chain.run_cublas, args.replays), 1), "tile": []}
        for config in grid:
            try:
                us = round(time_graph(lambda chain=chain, config=config: chain.run_tile(config), args.replays), 1)
            except Exception as error:  # e.g. a tile that needs more shared memory than the GPU has
                print(f"rows {num_rows} {config}: {type(error).__name__}: {str(error)[:120]}", flush=True)
                continue
            entry = dict(zip(("block_n", "block_k", "num_warps", "num_stages"), config, strict=True))
            row["tile"].append({**entry, "chain_us": us, "max_relative_difference": max_difference(chain, config)})
        best = min(row["tile"], key=lambda entry: entry["chain_us"])
        row["best_tile"] = best
        print(f"rows {num_rows}: cuBLAS path {row['cublas_chain_us']} µs, best tile {best}", flush=True)
        results.append(row)
        del chain
        torch.cuda.empty_cache()
    report = {
        "benchmark": "tile-matmul",
        "commit": commit(),
        "device": torch.cuda.get_device_name(),
        "layers": LAYERS,
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"tile-matmul-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

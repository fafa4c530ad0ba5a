"""`python bench/draw_top_k_probe.py LABEL` on a GPU: µs a `draw_top_k` launch takes, bf16 and fp32 logits, batch
1 and 64 (V 2048, H 1024: a 0.6B code-predictor codebook), timed in one CUDA graph of 50 chained launches, the
median of 30 replays. One line a case on stdout, starting with LABEL; run it once per installed tree to compare two
commits on one machine (bench/results/draw-key-bits-771f74e.txt: 623a878 against 771f74e)."""

from __future__ import annotations

import sys

import torch

from chorus.talker.models.select_kernel import draw_top_k

CHAIN, REPLAYS, VOCAB_SIZE, HIDDEN_SIZE, TOP_K = 50, 30, 2048, 1024, 50


def time_draw(dtype: torch.dtype, batch: int) -> float:
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(batch, VOCAB_SIZE, device="cuda", generator=generator) * 4).to(dtype)
    table = torch.randn(VOCAB_SIZE, HIDDEN_SIZE, device="cuda", dtype=torch.bfloat16)
    do_sample = torch.ones(batch, dtype=torch.bool, device="cuda")
    temperature = torch.full((batch,), 0.9, device="cuda")
    top_k = torch.full((batch,), TOP_K, dtype=torch.int64, device="cuda")
    seed, frame = torch.arange(batch, device="cuda"), torch.zeros(batch, dtype=torch.int64, device="cuda")

    def chain() -> None:
        for codebook in range(CHAIN):
            draw_top_k(logits, do_sample, temperature, top_k, seed, frame, 1 + codebook % 15, TOP_K, table)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        chain()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        chain()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CHAIN)
    return sorted(times)[REPLAYS // 2]


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "draw"
    for dtype in (torch.bfloat16, torch.float32):
        for batch in (1, 64):
            print(f"{label} {str(dtype).removeprefix('torch.')} batch {batch} draw: {time_draw(dtype, batch):.2f} us")


if __name__ == "__main__":
    main()

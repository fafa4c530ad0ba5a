"""`python bench/l2_prefetch_probe.py [OUT.json]` on a Hopper GPU: would prefetching weights into L2 speed up a
decode step's matmuls?

An experiment kept for its answer, not a serving path. A 0.6B frame runs 103 layers' four projections (QKV
1024→4096, output 2048→1024, gate/up 1024→6144, down 3072→1024) on a few rows; cuBLAS takes 5.7–8.5 µs for each,
bound by the latency of filling its memory pipeline from HBM, not by bandwidth (`bench/skinny_matmul_sweep.py`).
A layer's weights (31 MB) fit in the H100's 50 MB L2. This times, as CUDA-graph replays, a chain of 103 such
layers (the products and the two residual adds) with:
  cold                 distinct weights per layer, as in the model (each read from HBM)
  hot                  one layer's weights for all 103 (read from L2: the bound any prefetch can reach)
  hot_with_prefetch    hot, with the inline prefetch kernels below: their own cost
  prefetch_inline      cold, and before each layer's QKV a kernel issues `cp.async.bulk.prefetch.L2` for the rest
                       of the layer and the next layer's QKV
  prefetch_side_layer  cold, the next layer prefetched on a second stream (forked in the graph) as each layer starts
  prefetch_side_gemm   cold, the next product's weight prefetched on the second stream as each product starts
  two_streams          cold, the rows split in two halves run as two chains on two streams
Weights of all layers sit in one buffer, in layer order, so a prefetch is one byte range. One JSON line per row
count; all of them in OUT.json if given.

Answer (H100, bench/results/l2-prefetch-20261127-211029.json): no. At 64 rows the chain takes 3.25 ms cold and
2.57 hot, so L2 could save at most a fifth; but a prefetch kernel costs about what it saves. Inline, each waits for
its 31 MB to arrive (hot 2.57 → 3.63 ms with them; cold 4.17); on a second stream the fetches compete with the
products for the memory system (side_layer 3.72, side_gemm 3.35 ms). At 256 rows hot and cold are within 3 %
(3.61 / 3.69 ms): there the products are not waiting on HBM. Two half-batch chains on two streams are slower
than one chain of all the rows at every count (3.78 against 3.25 ms at 64).
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

HIDDEN = 1024
SHAPES = ((4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072))  # (out, in): qkv, o, gate_up, down
LAYERS = 103
ROWS = (16, 64, 256)
CHUNK_BYTES = 16 << 10
CHUNKS_PER_PROGRAM = 64


@triton.jit
def _prefetch_kernel(base, num_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    chunks = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), num_chunks - 1)
    pointers = base + chunks.to(tl.int64) * CHUNK
    tl.inline_asm_elementwise(
        f"cp.async.bulk.prefetch.L2.global [$1], {CHUNK}; mov.u32 $0, 0;",
        "=r,l",
        [pointers],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def prefetch(flat: torch.Tensor, start: int, stop: int) -> None:
    """Bytes [start, stop) of `flat` (uint8) into L2, in whole chunks."""
    num_chunks = max(1, (stop - start) // CHUNK_BYTES)
    grid = (triton.cdiv(num_chunks, CHUNKS_PER_PROGRAM),)
    _prefetch_kernel[grid](flat[start:], num_chunks, CHUNK=CHUNK_BYTES, BLOCK=CHUNKS_PER_PROGRAM)


class Layers:
    def __init__(self, distinct: int) -> None:
        per_layer = sum(out * inp for out, inp in SHAPES)
        self.buffer = torch.randn(distinct * per_layer, device="cuda", dtype=torch.bfloat16) * 0.02
        self.bytes = self.buffer.view(torch.uint8)
        self.per_layer_bytes = per_layer * 2
        self.layers, offset = [], 0
        for _ in range(distinct):
            weights = []
            for out, inp in SHAPES:
                weights.append(self.buffer[offset : offset + out * inp].view(out, inp))
                offset += out * inp
            self.layers.append(weights)

    def weights(self, index: int) -> list[torch.Tensor]:
        return self.layers[index % len(self.layers)]


def chain(x: torch.Tensor, layers: Layers, prefetch_mode: str | None = None, side=None) -> torch.Tensor:
    """`prefetch_mode`: None; "inline" (before each QKV, in the chain: the rest of the layer and the next QKV);
    "side_layer" (on the `side` stream as each layer starts: the whole next layer); "side_gemm" (on `side` as each
    product starts: the next product's weight)."""
    products = [weight for index in range(LAYERS) for weight in layers.weights(index)]
    offsets = [(weight.data_ptr() - layers.buffer.data_ptr()) * 2 for weight in products]
    sizes = [weight.numel() * 2 for weight in products]

    def fetch(first: int, last: int, on_side: bool) -> None:
        """Products [first, last)'s weights into L2."""
        if first >= len(products):
            return
        last = min(last, len(products))
        start, stop = offsets[first], offsets[last - 1] + sizes[last - 1]
        if stop <= start:  # the hot set repeats one layer: wrap around
            stop = start + sum(sizes[first:last])
        stop = min(stop, layers.bytes.numel())
        if not on_side:
            prefetch(layers.bytes, start, stop)
            return
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            prefetch(layers.bytes, start, stop)

    def linear(inputs: torch.Tensor, index: int) -> torch.Tensor:
        if prefetch_mode == "side_gemm":
            fetch(index + 1, index + 2, on_side=True)
        return F.linear(inputs, products[index])

    for layer in range(LAYERS):
        first = 4 * layer
        if prefetch_mode == "inline":
            fetch(first + 1, first + 5, on_side=False)
        elif prefetch_mode == "side_layer":
            fetch(first + 4, first + 8, on_side=True)
        attended = linear(x, first)[:, :2048]
        x = x + linear(attended, first + 1)
        x = x + linear(linear(x, first + 2)[:, :3072], first + 3)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    return x


def two_streams(x: torch.Tensor, layers: Layers, side: torch.cuda.Stream) -> torch.Tensor:
    half = x.shape[0] // 2
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = chain(x[:half], layers)
    second = chain(x[half:], layers)
    torch.cuda.current_stream().wait_stream(side)
    return torch.cat((first, second))


def replay_ms(run, reps: int = 20) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def probe(rows: int, cold: Layers, hot: Layers, side: torch.cuda.Stream) -> dict:
    x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    row = {"device": torch.cuda.get_device_name(), "rows": rows, "layers": LAYERS}
    variants = {
        "cold": lambda: chain(x, cold),
        "hot": lambda: chain(x, hot),
        "hot_with_prefetch": lambda: chain(x, hot, "inline"),  # the prefetch kernels' own cost
        "prefetch_inline": lambda: chain(x, cold, "inline"),
        "prefetch_side_layer": lambda: chain(x, cold, "side_layer", side),
        "prefetch_side_gemm": lambda: chain(x, cold, "side_gemm", side),
        "two_streams": lambda: two_streams(x, cold, side),
    }
    for name, run in variants.items():
        try:
            row[f"{name}_ms"] = round(replay_ms(run), 4)
        except Exception as error:  # an experiment: report and go on
            row[f"{name}_error"] = f"{type(error).__name__}: {error}"[:300]
    torch.testing.assert_close(chain(x, cold, "side_gemm", side), chain(x, cold))
    return row


@torch.inference_mode()
def main() -> None:
    cold, hot, side = Layers(LAYERS), Layers(1), torch.cuda.Stream()
    results = []
    for rows in ROWS:
        results.append(probe(rows, cold, hot, side))
        print(json.dumps(results[-1]), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()

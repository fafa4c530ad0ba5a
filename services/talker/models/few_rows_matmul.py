"""`x @ weightᵀ` for a few rows of `x` (at most MAX_ROWS), the decode step's projections at small batch on CUDA.

Why: at batch 1 a decode step's ~430 projections are bound by reading their weights, yet cuBLAS's kernels for one
row (`nvjet_sm90_tst_64x8_…`, and for the MLP's down projection split-K plus a reduce kernel) took 2.6 of the step's
3.9 ms of GPU time on an H100, reading the weights at ~1.4 TB/s, under half its bandwidth
(bench/results/kernels-20261126-104549).

How: one program per BLOCK_N output columns streams those columns' weight rows once along K and multiplies them
with every input row at once (the rows are few, so the products stay in registers), accumulating in fp32 and
rounding once to the activation dtype, as cuBLAS does; only the order of the additions differs. Small BLOCK_N gives
enough programs to fill the GPU without splitting K.

Tuning: on the first call of each (rows, N, K, dtype), which the engine's warm-up reaches before it captures its
CUDA graphs, the block sizes are autotuned and the tuned kernel is timed against cuBLAS; the faster of the two serves
that shape from then on, so a shape where the kernel loses keeps cuBLAS. Timing runs on the current stream, from a
cold L2 cache (a decode step's weights never stay in it), behind a GPU-side wait so that the host's launch latency
(~0.1 ms for a Triton launch from Python, far more than the kernel) is not measured, and it synchronises only that
stream: in the speech process the vocoder may be capturing a graph on another thread meanwhile.

`few_rows_matmul` is a `torch.library.custom_op` with a fake implementation, so compiled code keeps it as one call
and CUDA graphs capture its single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 4  # past a few rows cuBLAS's tiles are no longer mostly empty
HOST_LEAD_CYCLES = 20_000_000  # ~10 ms of GPU clock: time for the host to queue every timed run behind it


def _configs() -> list[triton.Config]:
    return [
        triton.Config({"BLOCK_N": block_n, "BLOCK_K": block_k}, num_warps=num_warps)
        for block_n in (4, 8, 16)
        for block_k in (256, 512, 1024)
        for num_warps in (4, 8)
    ]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Keeps the configs whose product tile (rows × BLOCK_N × BLOCK_K fp32 values) is at most 64 values a thread."""
    rows = triton.next_power_of_2(named_args["num_rows"])
    fitting = [c for c in configs if rows * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= 64 * 32 * c.num_warps]
    return fitting or configs[:1]


def time_on_current_stream(run, quantiles=None, num_runs: int = 20) -> list[float]:
    """Median milliseconds of `run()` from a cold L2 cache (Triton's `do_bench` contract: one value per quantile
    asked, here the median for each), synchronising only the current stream."""
    stream = torch.cuda.current_stream()
    flush = torch.empty(64 * 2**20, dtype=torch.int8, device="cuda")  # larger than an H100's or H200's L2
    run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(num_runs)]
    torch.cuda._sleep(HOST_LEAD_CYCLES)
    for start, end in events:
        flush.zero_()
        start.record(stream)
        run()
        end.record(stream)
    stream.synchronize()
    median_ms = sorted(start.elapsed_time(end) for start, end in events)[num_runs // 2]
    return [median_ms] * len(quantiles or (0.5,))


@triton.autotune(
    configs=_configs(),
    key=["num_rows", "num_cols", "depth"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=time_on_current_stream,
)
@triton.jit
def _few_rows_matmul_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    num_rows,
    num_cols,
    depth,
    stride_x_row,
    stride_weight_col,
    stride_out_row,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < num_rows, cols < num_cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, depth, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < depth
        weight = tl.load(
            weight_ptr + cols[:, None] * stride_weight_col + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        x = tl.load(x_ptr + rows[:, None] * stride_x_row + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * weight.to(tl.float32)[None, :, :], axis=2)
    out = out_ptr + rows[:, None] * stride_out_row + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# (rows, N, K, dtype) → whether the kernel measured faster than cuBLAS there.
_USES_KERNEL: dict[tuple[int, int, int, torch.dtype], bool] = {}


@torch.library.custom_op("chorus::few_rows_matmul", mutates_args=())
def few_rows_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`x [M, K] @ weight [N, K]ᵀ` → `[M, N]` in x's dtype, for 1 ≤ M ≤ MAX_ROWS, by the faster of the kernel and
    cuBLAS for this shape (see the module's docstring)."""
    num_rows, depth = x.shape
    assert 1 <= num_rows <= MAX_ROWS and weight.shape[1] == depth and x.dtype == weight.dtype
    x = x if x.stride(-1) == 1 else x.contiguous()
    weight = weight if weight.stride(-1) == 1 else weight.contiguous()
    shape = (num_rows, weight.shape[0], depth, x.dtype)
    if shape not in _USES_KERNEL:
        if torch.cuda.is_current_stream_capturing():  # no timing inside a capture: cuBLAS, decided later
            return torch.nn.functional.linear(x, weight)
        kernel_ms = time_on_current_stream(lambda: _launch(x, weight))[0]  # autotunes first
        _USES_KERNEL[shape] = kernel_ms < time_on_current_stream(lambda: torch.nn.functional.linear(x, weight))[0]
    return _launch(x, weight) if _USES_KERNEL[shape] else torch.nn.functional.linear(x, weight)


def _launch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    num_rows, depth = x.shape
    num_cols = weight.shape[0]
    out = x.new_empty(num_rows, num_cols)
    block_m = triton.next_power_of_2(num_rows)
    grid = lambda meta: (triton.cdiv(num_cols, meta["BLOCK_N"]),)  # noqa: E731 — Triton's launch-grid idiom
    _few_rows_matmul_kernel[grid](
        x, weight, out, num_rows, num_cols, depth, x.stride(0), weight.stride(0), out.stride(0), BLOCK_M=block_m
    )
    return out


@few_rows_matmul.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


class FewRowsLinear(torch.nn.Module):
    """A bias-free `nn.Linear` whose forward takes `few_rows_matmul` for at most MAX_ROWS rows on CUDA and
    `F.linear` otherwise (prefills, large batches, the CPU). Shares the weight of the Linear it replaces."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        assert linear.bias is None
        self.weight = linear.weight
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_rows = x.numel() // self.in_features
        if x.is_cuda and num_rows <= MAX_ROWS:
            return few_rows_matmul(x.reshape(num_rows, self.in_features), self.weight).view(*x.shape[:-1], -1)
        return torch.nn.functional.linear(x, self.weight)

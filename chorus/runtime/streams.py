"""CUDA streams of an engine's worker thread: one to run on, one to capture CUDA graphs on.

Work on PyTorch's default (legacy) stream serialises with every other stream of the process. An engine that
shares its process — and its GPU — with another (`chorus serve speech`) runs on a non-blocking stream of its
own, so the two engines' kernels interleave on the GPU, the higher-priority one first.

Graph capture must tolerate that neighbour too: in PyTorch's default ("global") mode another thread's
allocation or synchronisation during a capture invalidates it — and leaves the allocator unable to capture
again. Each thread therefore captures on a stream of its own in thread-local mode (`graph_capture`).
"""

from __future__ import annotations

import contextlib
import threading

import torch

_per_thread = threading.local()


def use_own_stream(device: torch.device, priority: int | None) -> None:
    """Make a new stream the calling thread's current stream on `device` (no-op off CUDA or when `priority`
    is None). Lower numbers are higher priorities; CUDA clamps to its range (0 down to -5 on recent GPUs)."""
    if priority is None or device.type != "cuda":
        return
    torch.cuda.set_device(device)
    torch.cuda.set_stream(torch.cuda.Stream(device, priority=priority))


def capture_stream() -> torch.cuda.Stream:
    """The calling thread's stream for graph warm-up and capture on the current device, made once, so that no
    other thread ever launches work on it (streams come from a small round-robin pool)."""
    streams = _per_thread.__dict__.setdefault("capture_streams", {})
    device = torch.cuda.current_device()
    if device not in streams:
        streams[device] = torch.cuda.Stream(device)
    return streams[device]


@contextlib.contextmanager
def graph_capture(graph: torch.cuda.CUDAGraph, pool=None):
    """`torch.cuda.graph` on this thread's capture stream, in thread-local error mode: other threads of the
    process may keep using the GPU meanwhile."""
    with torch.cuda.graph(graph, pool=pool, stream=capture_stream(), capture_error_mode="thread_local"):
        yield


def capture_graph(run, pool=None, num_warmup_runs: int = 2):
    """`run()` warmed up on this thread's capture stream (as capture requires: lazy initialisation, autotuning),
    then captured with `graph_capture`; returns the graph and what the captured call returned (its static output).
    """
    stream = capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(num_warmup_runs):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph, pool):
        output = run()
    return graph, output

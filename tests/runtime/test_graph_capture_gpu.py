"""Graph capture keeps working while another thread of the process uses the GPU (`chorus serve speech` runs the
talker and the vocoder side by side, each capturing its graphs on first use). GPU only."""

from __future__ import annotations

import threading

import pytest
import torch

from chorus.runtime.streams import graph_capture, use_own_stream

pytestmark = pytest.mark.gpu


def test_capture_succeeds_while_a_neighbour_thread_allocates_and_synchronises():
    stop = threading.Event()

    def neighbour() -> None:
        use_own_stream(torch.device("cuda"), priority=-1)
        size = 1 << 20
        while not stop.is_set():
            block = torch.empty(size, device="cuda")  # new sizes: fresh device allocations
            block.fill_(1.0)
            torch.cuda.synchronize()  # forbidden during a capture in PyTorch's default (global) mode
            size = size * 2 if size < 1 << 26 else 1 << 20
            del block
            torch.cuda.empty_cache()

    thread = threading.Thread(target=neighbour, daemon=True)
    thread.start()
    try:
        x = torch.arange(4096, device="cuda", dtype=torch.float32)
        for round_index in range(20):
            graph = torch.cuda.CUDAGraph()
            with graph_capture(graph):
                y = (x * 2 + round_index).sin()
            x.add_(1)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, (x * 2 + round_index).sin())
    finally:
        stop.set()
        thread.join()

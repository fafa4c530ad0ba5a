"""The CUDA memory gauges on every service's /metrics: absent until the process uses CUDA, then what PyTorch's
allocator holds (the GPU half runs where there is a GPU)."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import REGISTRY, generate_latest

import chorus.runtime.metrics  # noqa: F401  (registers the collector)
from chorus.bench.breakdown import parse_metrics


def test_a_process_that_has_not_used_cuda_reports_no_gpu_memory():
    if torch.cuda.is_initialized():
        pytest.skip("this process already uses CUDA")
    assert b"chorus_cuda_memory" not in generate_latest(REGISTRY)
    assert not torch.cuda.is_initialized(), "scraping must not initialise CUDA"


@pytest.mark.gpu
def test_gpu_memory_is_what_the_allocator_holds():
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")
    values = parse_metrics(generate_latest(REGISTRY).decode())
    assert values["chorus_cuda_memory_allocated_bytes"] >= block.numel()
    assert values["chorus_cuda_memory_reserved_bytes"] >= values["chorus_cuda_memory_allocated_bytes"]
    assert values["chorus_cuda_memory_max_allocated_bytes"] >= block.numel()

"""The bench's memory watch: series summaries on hand-made samples, and sampling real processes."""

from __future__ import annotations

import asyncio
import os

from chorus.bench.local_processes import rss_bytes
from chorus.bench.memory import MemoryWatch, series_summary


def test_a_series_reports_its_ends_its_peak_and_its_late_growth_per_minute():
    warm_up_then_leak = [(0.0, 100.0), (30.0, 500.0), (60.0, 500.0), (90.0, 501.0), (120.0, 502.0), (150.0, 503.0)]
    summary = series_summary(warm_up_then_leak)
    assert summary == {"first": 100.0, "last": 503.0, "max": 503.0, "growth_per_min": 2.0}
    flat = [(float(t), 200.0) for t in range(0, 60, 2)]
    assert series_summary(flat)["growth_per_min"] == 0.0
    assert series_summary([(0.0, 7.0)]) == {"first": 7.0, "last": 7.0, "max": 7.0, "growth_per_min": None}


def test_resident_memory_is_read_from_proc():
    assert rss_bytes(os.getpid()) > 10 * 2**20
    assert rss_bytes(2**22 + 1) is None  # above the kernel's pid limit: never a process


async def test_the_watch_samples_each_group_and_the_cuda_gauges_it_is_given():
    gauges = {"chorus_cuda_memory_allocated_bytes": 3 * 2**20, "chorus_cuda_memory_reserved_bytes": 4 * 2**20}

    async def read_gauges() -> dict[str, float]:
        return gauges

    watch = MemoryWatch({"speech": frozenset([os.getpid()])}, read_gauges, interval_s=0.01)
    watch.start()
    await asyncio.sleep(0.1)
    memory = await watch.stop()
    assert memory.keys() == {"speech_rss_mib", "gpu_allocated_mib", "gpu_reserved_mib"}
    assert memory["gpu_reserved_mib"]["last"] == 4.0 and memory["speech_rss_mib"]["first"] > 10
    assert len(watch.samples["speech_rss_mib"]) >= 3


async def test_a_stack_off_cuda_has_no_gpu_series_and_a_gone_process_leaves_gaps():
    async def no_gauges() -> dict[str, float]:
        return {}

    watch = MemoryWatch({"gateway": frozenset([os.getpid()]), "gone": frozenset([2**22 + 1])}, no_gauges)
    memory = await watch.stop()  # a level shorter than one interval still gets its end sample
    assert memory.keys() == {"gateway_rss_mib"}

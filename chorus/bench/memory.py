"""Memory of the local stack over a bench level, sampled every few seconds: the resident memory of the speech
and gateway processes (/proc) and the CUDA memory the speech services report (`chorus_cuda_memory_*` on their
/metrics). A long level (`--requests-per-level 1024` at 64 streams is ~30 minutes of audio per stream slot)
then shows whether memory stays flat: each series reports its first and last samples, its peak, and its growth
per minute from the level's second half on (after caches have warmed up)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from chorus.bench.local_processes import rss_bytes

MIB = 2**20
CUDA_GAUGES = {  # series → gauge
    "gpu_allocated_mib": "chorus_cuda_memory_allocated_bytes",
    "gpu_reserved_mib": "chorus_cuda_memory_reserved_bytes",
}
ReadGauges = Callable[[], Awaitable[dict[str, float]]]  # the speech services' gauges, summed; {} when unreachable


def series_summary(samples: list[tuple[float, float]]) -> dict:
    """{first, last, max, growth_per_min} of (time s, value) samples; growth is the least-squares slope over
    the second half of the samples (None with fewer than two there)."""
    values = [value for _, value in samples]
    late = samples[len(samples) // 2 :]
    return {
        "first": round(values[0], 1),
        "last": round(values[-1], 1),
        "max": round(max(values), 1),
        "growth_per_min": None if len(late) < 2 else round(_slope(late) * 60, 2),
    }


def _slope(samples: list[tuple[float, float]]) -> float:
    mean_t = sum(t for t, _ in samples) / len(samples)
    mean_v = sum(v for _, v in samples) / len(samples)
    spread = sum((t - mean_t) ** 2 for t, _ in samples)
    return sum((t - mean_t) * (v - mean_v) for t, v in samples) / spread if spread > 0 else 0.0


class MemoryWatch:
    """Samples from `start()` to `stop()`, which returns {series name: summary} in MiB. Series: the resident
    memory of each process group (summed over its processes) and, when the speech services use CUDA, their GPU
    memory (summed over processes and devices)."""

    def __init__(self, groups: dict[str, frozenset[int]], read_gauges: ReadGauges, interval_s: float = 2.0) -> None:
        self.groups = groups  # name → pids, e.g. {"speech": …, "gateway": …}
        self.read_gauges = read_gauges
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self._sampling: asyncio.Task | None = None

    def start(self) -> None:
        self._sampling = asyncio.create_task(self._sample_until_stopped())

    async def stop(self) -> dict:
        if self._sampling is not None:
            self._sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampling
        await self._sample()  # the level's end, however short it was
        return {name: series_summary(samples) for name, samples in self.samples.items()}

    async def _sample_until_stopped(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(self.interval_s)

    async def _sample(self) -> None:
        at_s = time.monotonic()
        for name, pids in self.groups.items():
            sizes = [rss_bytes(pid) for pid in pids]
            if None not in sizes:  # a process that exited leaves a gap, not a drop
                self._add(f"{name}_rss_mib", at_s, sum(sizes) / MIB)
        gauges = await self.read_gauges()
        for series, gauge in CUDA_GAUGES.items():
            if gauge in gauges:  # a stack off CUDA has no GPU series
                self._add(series, at_s, gauges[gauge] / MIB)

    def _add(self, series: str, at_s: float, value: float) -> None:
        self.samples.setdefault(series, []).append((at_s, value))

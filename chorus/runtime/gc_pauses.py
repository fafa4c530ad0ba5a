"""How long the cyclic garbage collector stopped this process, as a Prometheus histogram by generation.

A collection holds the GIL for its whole scan, so every thread of the process stops with it: an engine's loop, the
event loop relaying audio. `gc.freeze()` after warm-up (`chorus.runtime.host`) takes the warm-up's objects out of
the scans, but what serving keeps alive (hundreds of streams' records, messages and arrays) is still scanned, and a
full (generation 2) collection over it stalls every stream of the process at once. (On an H200 at 256 streams the
speech process spent 2–4 % of its time in ~150 collections a 4–5 s bench level, almost none over 25 ms:
docs/performance-log.md, 2026-11-29.) Gateway workers share one /metrics through files; this histogram is each
process's own, so theirs is not reported.

The callback only adds to plain lists: it runs inside whatever allocation triggered the collection, which may be
inside a metric's lock, so it must take none. The figures are read at scrape time (`GcPauseCollector`)."""

from __future__ import annotations

import bisect
import gc
import itertools
import time
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GENERATIONS = 3

_counts = [[0] * (len(BUCKETS_S) + 1) for _ in range(GENERATIONS)]  # per generation, per bucket (the last: +Inf)
_sums_s = [0.0] * GENERATIONS
_started_s: float | None = None


def _on_collection(phase: str, info: dict) -> None:
    global _started_s
    if phase == "start":
        _started_s = time.perf_counter()
    elif _started_s is not None:
        paused_s, generation = time.perf_counter() - _started_s, info["generation"]
        _counts[generation][bisect.bisect_left(BUCKETS_S, paused_s)] += 1
        _sums_s[generation] += paused_s
        _started_s = None


class GcPauseCollector(Collector):
    """`chorus_gc_pause_seconds{generation}`: the duration of each collection since `watch_gc_pauses()`."""

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "chorus_gc_pause_seconds",
            "Garbage collections of this process, by generation, by how long they held the GIL (every thread waits).",
            labels=["generation"],
        )
        bounds = [*map(str, BUCKETS_S), "+Inf"]
        for generation in range(GENERATIONS):
            buckets = list(zip(bounds, itertools.accumulate(_counts[generation]), strict=True))
            family.add_metric([str(generation)], buckets, _sums_s[generation])
        yield family


def watch_gc_pauses() -> None:
    """Time every collection from now on (once per process)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)

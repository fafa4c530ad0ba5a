"""How long the cyclic garbage collector stopped this process, as a Prometheus histogram by generation.

A collection holds the GIL for its whole scan, so every thread of the process stops with it: an engine's loop, the
event loop relaying audio. `gc.freeze()` after warm-up (`chorus.runtime.host`) takes the warm-up's objects out of
the scans, but what serving keeps alive (hundreds of streams' records, messages and arrays) is still scanned, and a
full (generation 2) collection over it stalls every stream of the process at once. (On an H200 at 256 streams the
speech process spent 2–4 % of its time in ~150 collections a 4–5 s bench level, almost none over 25 ms:
docs/performance-log.md, 2026-11-29.)

The callback only appends to a queue: it runs inside whatever allocation triggered the collection, which may hold a
metric's lock, so it must take none. The pauses reach the histogram outside it: when this process's /metrics is read
(`GcPauseCollector`) and, in a process whose metrics go to files for another to merge (gateway workers), from a
thread every second."""

from __future__ import annotations

import collections
import gc
import os
import threading
import time
from collections.abc import Iterator

from prometheus_client import Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GENERATIONS = 3
FILE_FLUSH_INTERVAL_S = 1.0

METRIC = "chorus_gc_pause_seconds"
GC_PAUSE_SECONDS = Histogram(
    METRIC,
    "Garbage collections of this process, by generation, by how long they held the GIL (every thread waits).",
    ["generation"],
    buckets=BUCKETS_S,
    registry=None,  # collected through GcPauseCollector, which first records what is queued
)
for _generation in range(GENERATIONS):
    GC_PAUSE_SECONDS.labels(str(_generation))

# (generation, seconds) of collections not yet observed; bounded for a process nobody scrapes (~1 MB, minutes of
# collections at hundreds of streams), which then drops the oldest.
_queued: collections.deque[tuple[int, float]] = collections.deque(maxlen=10_000)
_started_s: float | None = None


def _on_collection(phase: str, info: dict) -> None:
    global _started_s
    if phase == "start":
        _started_s = time.perf_counter()
    elif _started_s is not None:
        _queued.append((info["generation"], time.perf_counter() - _started_s))
        _started_s = None


def record_queued() -> None:
    """Observe the collections timed since the last call (never from inside one)."""
    while True:
        try:
            generation, paused_s = _queued.popleft()
        except IndexError:  # empty, or emptied by a concurrent scrape
            return
        GC_PAUSE_SECONDS.labels(str(generation)).observe(paused_s)


class GcPauseCollector(Collector):
    """`chorus_gc_pause_seconds{generation}`: the duration of each collection since `watch_gc_pauses()`."""

    def collect(self) -> Iterator[Metric]:
        record_queued()
        yield from GC_PAUSE_SECONDS.collect()


def watch_gc_pauses() -> None:
    """Time every collection from now on (once per process)."""
    if _on_collection in gc.callbacks:
        return
    gc.callbacks.append(_on_collection)
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:  # nothing reads this process's collector: write to the files
        threading.Thread(target=_record_to_files, name="gc-pauses", daemon=True).start()


def _record_to_files() -> None:
    while True:
        time.sleep(FILE_FLUSH_INTERVAL_S)
        record_queued()

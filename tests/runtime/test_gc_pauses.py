"""The garbage-collection pause histogram on every service's /metrics: each real collection, by generation."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

import chorus.runtime.metrics  # noqa: F401  (registers the collector)
from chorus.runtime.gc_pauses import watch_gc_pauses


def _generation_2() -> dict[str, float]:
    """{sample name (with `le` for buckets): value} of generation 2's series."""
    page = generate_latest(REGISTRY).decode()
    family = next(f for f in text_string_to_metric_families(page) if f.name == "chorus_gc_pause_seconds")
    return {
        sample.name + (f"@{sample.labels['le']}" if "le" in sample.labels else ""): sample.value
        for sample in family.samples
        if sample.labels["generation"] == "2"
    }


def test_a_full_collection_is_counted_with_how_long_it_held_the_process():
    watch_gc_pauses()
    watch_gc_pauses()  # a second call must not time each collection twice
    gc.disable()  # only the collection below: none triggered by the allocations meanwhile
    try:
        before = _generation_2()
        cycles = []
        for _ in range(200_000):  # objects a full collection must walk: it takes milliseconds, not microseconds
            node: list = []
            node.append(node)
            cycles.append(node)
        started = time.perf_counter()
        gc.collect()
        took_s = time.perf_counter() - started
    finally:
        gc.enable()
    after = _generation_2()
    assert after["chorus_gc_pause_seconds_count"] == before["chorus_gc_pause_seconds_count"] + 1
    paused_s = after["chorus_gc_pause_seconds_sum"] - before["chorus_gc_pause_seconds_sum"]
    assert 0 < paused_s <= took_s
    # Cumulative buckets: the collection is in every bucket at or above its duration and in none below.
    for name, value in after.items():
        if "@" in name:
            bound = float(name.split("@")[1])
            assert value - before[name] == (1 if paused_s <= bound else 0), name


_WORKER = """
import gc, time
from chorus.runtime.gc_pauses import FILE_FLUSH_INTERVAL_S, watch_gc_pauses
watch_gc_pauses()
for _ in range({collections}):
    gc.collect()
time.sleep(FILE_FLUSH_INTERVAL_S * 2.5)  # the thread writes what it timed to the shared files
"""


def test_gateway_workers_pauses_are_summed_from_their_files(tmp_path):
    # Two real processes in prometheus_client's multiprocess mode, as `chorus serve gateway --workers 2` runs them.
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    workers = [subprocess.Popen([sys.executable, "-c", _WORKER.format(collections=count)], env=env) for count in (3, 4)]
    assert [worker.wait(timeout=60) for worker in workers] == [0, 0]
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    merged = next(f for f in text_string_to_metric_families(generate_latest(registry).decode())
                  if f.name == "chorus_gc_pause_seconds")  # fmt: skip
    full = {s.name: s.value for s in merged.samples if s.labels["generation"] == "2" and "le" not in s.labels}
    assert full["chorus_gc_pause_seconds_count"] >= 3 + 4, full  # explicit ones, and any the interpreter ran
    assert full["chorus_gc_pause_seconds_sum"] > 0, full

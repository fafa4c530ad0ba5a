"""The garbage-collection pause histogram on every service's /metrics: each real collection, by generation."""

from __future__ import annotations

import gc
import time

from prometheus_client import REGISTRY, generate_latest
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

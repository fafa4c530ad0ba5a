"""The event-loop lag histogram: a loop held by one long callback shows as one late wake-up of that length."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY

from chorus.runtime.loop_lag import METRIC, watch_loop_lag


def _sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_loop_held_for_200_ms_is_one_wake_up_late_by_about_that():
    before_count = _sample(f"{METRIC}_count")
    before_late = before_count - _sample(f"{METRIC}_bucket", le="0.1")
    before_sum = _sample(f"{METRIC}_sum")
    watch = asyncio.create_task(watch_loop_lag(interval_s=0.01))
    try:
        await asyncio.sleep(0.1)  # on time: wake-ups a few ms late at most
        time.sleep(0.2)  # the loop held, as by a long callback or a thread holding the GIL
        await asyncio.sleep(0.1)
    finally:
        watch.cancel()
    wakeups = _sample(f"{METRIC}_count") - before_count
    late = _sample(f"{METRIC}_count") - _sample(f"{METRIC}_bucket", le="0.1") - before_late
    lag_s = _sample(f"{METRIC}_sum") - before_sum
    assert wakeups >= 10, wakeups  # ~20 in the 400 ms: one per 10 ms while the loop was free
    assert late == 1, "only the wake-up due during the hold was over 100 ms late"
    assert 0.18 <= lag_s < 0.35, lag_s

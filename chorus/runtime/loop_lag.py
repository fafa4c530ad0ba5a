"""How late this process's event loop runs what is due, as a Prometheus histogram.

A service's event loop relays every stream's messages. While it cannot run (one long callback, the GIL held by an
engine thread, a burst of new streams to set up), every stream of the process waits, and a request that came then
waits before its service even sees it. A task due every INTERVAL_S records how late it woke: the time anything
due on the loop then waited. (On an H200 at 256 streams it put the speech process's loop 5–7 ms late on the mean
and never over 50 ms, while the slowest requests spent up to 0.6 s on their way to the talker engine: the slow part
was grpc.aio's intake of new calls, not the loop; docs/performance-log.md, 2026-11-29.)
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

INTERVAL_S = 0.025
BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

METRIC = "chorus_event_loop_lag_seconds"
LOOP_LAG_SECONDS = Histogram(
    METRIC,
    f"How late this process's event loop woke a task due every {INTERVAL_S * 1000:g} ms: what was due waited so long.",
    buckets=BUCKETS_S,
)


async def watch_loop_lag(interval_s: float = INTERVAL_S) -> None:
    """Observe the running loop's lag every `interval_s`, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - due))

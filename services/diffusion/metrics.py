"""Diffusion metrics: step time, batch size, queue depth, live requests."""

from __future__ import annotations

from prometheus_client import Gauge, Histogram

STEP_SECONDS = Histogram(
    "chorus_diffusion_step_seconds",
    "Wall time of one engine step (one DiT forward for every live sample).",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
)
BATCH_SIZE = Histogram("chorus_diffusion_batch_size", "Samples advanced by one step.", buckets=(1, 2, 4, 8, 16, 32, 64))
QUEUE_DEPTH = Gauge("chorus_diffusion_queue_depth", "Requests waiting for a batch slot.")
LIVE_REQUESTS = Gauge("chorus_diffusion_live_requests", "Requests being generated.")

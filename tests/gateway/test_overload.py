"""Bounded overload on loopback: a burst far beyond capacity against the real tiny diffusion service.

Excess requests get 429 with Retry-After, admitted ones complete, nothing answers 5xx, and the
gateway's wait queue never grows past its bound. The burst is fixed in size, so the test stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import REGISTRY

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.runtime.host import ServiceHost

NUM_REQUESTS = 24
MAX_IN_FLIGHT, MAX_QUEUED = 1, 3


@pytest.fixture
async def diffusion_target():
    config = DiffusionConfig(device="cpu", metrics_port=-1, grace_s=1.0)
    host = ServiceHost(config, DiffusionService(config))
    await host.start()
    yield f"127.0.0.1:{host.port}"
    await host.stop()


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


async def test_a_burst_beyond_capacity_gets_429s_and_no_5xx(start_gateway, redis_url, diffusion_target):
    limits = {"diffusion_max_in_flight": MAX_IN_FLIGHT, "max_queued": MAX_QUEUED, "queue_timeout_s": 20.0}
    overrides = {"diffusion_targets": (diffusion_target,)} | limits
    async with start_gateway(redis_url, **overrides) as (gateway, http, _):
        replica = gateway.context.backends.replicas["diffusion"][0]
        for _ in range(200):
            if replica.is_healthy:
                break
            await asyncio.sleep(0.05)
        admission = gateway.context.admission.backends["diffusion"]
        peak = {"queue_depth": 0, "in_flight": 0}

        async def watch() -> None:
            while True:
                peak["queue_depth"] = max(peak["queue_depth"], admission.queue_depth)
                peak["in_flight"] = max(peak["in_flight"], admission.num_in_flight)
                await asyncio.sleep(0.005)

        body = {"model": "stable-audio-open-1.0", "prompt": "surf", "duration_s": 0.5, "num_steps": 20, "seed": 1}
        rss_before = rss_bytes()
        watcher = asyncio.create_task(watch())
        try:
            replies = await asyncio.gather(
                *(
                    http.post("/v1/audio/generations", json=body | {"response_format": "wav"}, timeout=60)
                    for _ in range(NUM_REQUESTS)
                )
            )
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        codes = [reply.status_code for reply in replies]
        assert set(codes) <= {200, 429}, codes
        refused = [reply for reply in replies if reply.status_code == 429]
        admitted = [reply for reply in replies if reply.status_code == 200]
        assert len(refused) >= NUM_REQUESTS - 2 * (MAX_IN_FLIGHT + MAX_QUEUED)
        assert len(admitted) >= MAX_IN_FLIGHT + MAX_QUEUED
        assert all(int(reply.headers["retry-after"]) >= 1 for reply in refused)
        assert all(reply.json()["error"]["type"] == "rate_limit_error" for reply in refused)
        # Seeded: every admitted request completed with the same, whole file.
        assert len({reply.content for reply in admitted}) == 1 and len(admitted[0].content) > 44
        assert peak["queue_depth"] <= MAX_QUEUED and peak["in_flight"] <= MAX_IN_FLIGHT
        assert admission.num_in_flight == 0 and admission.queue_depth == 0
        assert rss_bytes() - rss_before < 200 * 1024 * 1024
        refusals = REGISTRY.get_sample_value(
            "chorus_gateway_requests_total", {"endpoint": "/v1/audio/generations", "outcome": "429"}
        )
        assert refusals >= len(refused)

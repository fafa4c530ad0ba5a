"""Gateway tests: a real gateway (uvicorn + gRPC in this process) with its backends down."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest

from chorus.gateway.config import GatewayConfig
from chorus.gateway.service import GatewayService
from chorus.runtime.host import ServiceHost
from chorus.runtime.processes import free_port


@contextlib.asynccontextmanager
async def running_gateway(redis_url: str, **overrides) -> AsyncIterator[tuple[GatewayService, httpx.AsyncClient, str]]:
    """The gateway, an HTTP client for its REST API, and its gRPC target."""
    down = (f"127.0.0.1:{free_port()}",)  # nothing listens: every backend is unhealthy
    settings = dict(
        rest_port=0,
        metrics_port=-1,
        redis_url=redis_url,
        health_interval_s=0.2,
        talker_targets=down,
        vocoder_targets=down,
        diffusion_targets=down,
        run_queue=f"chorus:runs:{uuid.uuid4().hex}",  # runs left in flight by one test are not another test's
    )
    config = GatewayConfig(**(settings | overrides))
    gateway = GatewayService(config)
    host = ServiceHost(config, gateway)
    await host.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.rest_port}", timeout=10) as client:
            yield gateway, client, f"127.0.0.1:{host.port}"
    finally:
        await host.stop()


@pytest.fixture
def start_gateway():
    """`async with start_gateway(redis_url, **config_overrides) as (gateway, http_client, grpc_target)`."""
    return running_gateway

"""The gateway's /health and /ready against real backend servers and a real Redis."""

from __future__ import annotations

import asyncio

import grpc
import httpx
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.gateway.config import GatewayConfig
from chorus.gateway.service import GatewayService
from chorus.runtime.host import ServiceHost
from chorus.runtime.processes import free_port, free_ports
from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.service import VocoderService


async def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_ready_follows_backend_health(redis_url):
    ports = dict(zip(("talker", "vocoder", "diffusion"), free_ports(3), strict=True))
    config = GatewayConfig(
        rest_port=0,
        metrics_port=-1,
        redis_url=redis_url,
        health_interval_s=0.1,
        talker_targets=(f"127.0.0.1:{ports['talker']}",),
        vocoder_targets=(f"127.0.0.1:{ports['vocoder']}",),
        diffusion_targets=(f"127.0.0.1:{ports['diffusion']}",),
    )
    gateway = GatewayService(config)
    gateway_host = ServiceHost(config, gateway)
    await gateway_host.start()
    backends = [
        ServiceHost(TalkerConfig(port=ports["talker"], metrics_port=-1), TalkerService(TalkerConfig())),
        ServiceHost(VocoderConfig(port=ports["vocoder"], metrics_port=-1), VocoderService(VocoderConfig())),
        ServiceHost(DiffusionConfig(port=ports["diffusion"], metrics_port=-1), DiffusionService(DiffusionConfig())),
    ]
    base = f"http://127.0.0.1:{gateway.rest_port}"
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/health")).json() == {"status": "ok"}
        not_ready = await client.get("/ready")
        assert not_ready.status_code == 503
        assert not_ready.json()["redis"] is True
        assert not_ready.json()["backends"]["talker"] == {f"127.0.0.1:{ports['talker']}": False}

        for host in backends:
            await host.start()

        async def is_ready() -> bool:
            return (await client.get("/ready")).status_code == 200

        await wait_for(is_ready)

        await backends[1].stop()  # the vocoder goes away: the gateway is no longer ready

        async def is_not_ready() -> bool:
            reply = await client.get("/ready")
            return reply.status_code == 503 and not any(reply.json()["backends"]["vocoder"].values())

        await wait_for(is_not_ready)
        assert (await client.get("/health")).status_code == 200
    for host in (backends[0], backends[2], gateway_host):
        await host.stop()


async def test_ready_is_false_when_redis_is_down():
    config = GatewayConfig(rest_port=0, metrics_port=-1, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    gateway = GatewayService(config)
    host = ServiceHost(config, gateway)
    await host.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.rest_port}") as client:
        reply = await client.get("/ready")
    await host.stop()
    assert reply.status_code == 503 and reply.json()["redis"] is False


async def test_ready_turns_false_when_the_drain_begins(start_gateway, redis_url):
    """On SIGTERM the host calls the gateway's `drain` (tests/runtime/test_host.py): from then on /ready is 503,
    so a readiness probe takes the draining gateway out of rotation while its in-flight work finishes."""
    backend, health_servicer = grpc.aio.server(), health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, backend)
    target = (f"127.0.0.1:{backend.add_insecure_port('127.0.0.1:0')}",)  # one stand-in for every backend
    await backend.start()
    for name in ("chorus.v1.Talker", "chorus.v1.Vocoder", "chorus.v1.Diffusion"):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    backends = dict(talker_targets=target, vocoder_targets=target, diffusion_targets=target)
    async with start_gateway(redis_url, health_interval_s=0.1, **backends) as (gateway, client, _):

        async def is_ready() -> bool:
            return (await client.get("/ready")).status_code == 200

        await wait_for(is_ready)
        assert (await client.get("/ready")).json()["draining"] is False
        await gateway.drain()
        reply = await client.get("/ready")
        assert reply.status_code == 503
        assert reply.json()["draining"] is True and reply.json()["redis"] is True
        assert (await client.get("/health")).status_code == 200, "liveness is not readiness"
    await backend.stop(None)

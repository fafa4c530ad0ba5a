"""The service host: health transitions, reflection, metrics, error boundary, graceful drain.

The service under the host here is a small test servicer on the real Diffusion contract that
streams progress events on a timer: the host, not a model, is what these tests exercise.
"""

from __future__ import annotations

import asyncio
import socket

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from chorus.runtime.config import ServiceConfig
from chorus.runtime.errors import InvalidRequest, Overloaded
from chorus.runtime.host import Service, ServiceHost
from chorus.v1 import common_pb2, diffusion_pb2, diffusion_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class TickerServicer(diffusion_pb2_grpc.DiffusionServicer):
    """Streams `num_steps` progress events 50 ms apart; prompts select failure modes."""

    async def Generate(self, request, context):
        if request.prompt == "invalid":
            raise InvalidRequest("prompt: 'invalid' is not allowed")
        if request.prompt == "busy":
            raise Overloaded("queue full")
        for step in range(1, request.num_steps + 1):
            await asyncio.sleep(0.05)
            if request.prompt == "crash" and step == 2:
                raise RuntimeError("secret internal detail")
            yield diffusion_pb2.GenerateOutput(progress=common_pb2.Progress(step=step, num_steps=request.num_steps))
        yield diffusion_pb2.GenerateOutput(final=common_pb2.Final(reason=common_pb2.FINISH_REASON_COMPLETE))

    async def GetLoad(self, request, context):
        raise ZeroDivisionError("not a user error")


class TickerService(Service):
    name = "ticker"
    grpc_services = ("chorus.v1.Diffusion",)

    def __init__(self) -> None:
        self.warm = asyncio.Event()
        self.closed = False
        self.num_drains = 0
        self.drain_error: Exception | None = None

    def register(self, server):
        diffusion_pb2_grpc.add_DiffusionServicer_to_server(TickerServicer(), server)

    async def start(self):
        await self.warm.wait()

    async def drain(self):
        self.num_drains += 1
        if self.drain_error is not None:
            raise self.drain_error

    async def close(self):
        self.closed = True


@pytest.fixture
async def host():
    service = TickerService()
    host = ServiceHost(ServiceConfig(grace_s=2.0), service)
    starting = asyncio.create_task(host.start())
    while host.port is None or host.metrics_port is None:
        await asyncio.sleep(0.01)
    yield host, service, starting
    if not starting.done():
        service.warm.set()
        await starting
    await host.stop()


async def health_status(channel, service_name: str = "chorus.v1.Diffusion"):
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service_name), timeout=2)
    return reply.status


async def test_health_is_not_serving_until_warm_then_serving_then_not_serving_on_stop(host):
    host, service, starting = host
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        assert await health_status(channel) == NOT_SERVING
        assert await health_status(channel, "") == NOT_SERVING
        service.warm.set()
        await starting
        assert await health_status(channel) == SERVING
        assert await health_status(channel, "") == SERVING
        # A watcher (like a load balancer) sees the flip to NOT_SERVING as soon as draining begins.
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="chorus.v1.Diffusion"))
        assert (await watch.read()).status == SERVING
        stopping = asyncio.create_task(host.stop())
        assert (await watch.read()).status == NOT_SERVING
        watch.cancel()
        await stopping
        assert service.num_drains == 1, "the service was told of the drain (the gateway's /ready turns 503)"


async def test_reflection_lists_the_services(host):
    host, service, starting = host
    service.warm.set()
    await starting
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        async for response in responses:
            names = {s.name for s in response.list_services_response.service}
            break
    assert {"chorus.v1.Diffusion", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


async def call(host, prompt: str, num_steps: int = 3, request_id: str | None = None):
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        stub = diffusion_pb2_grpc.DiffusionStub(channel)
        metadata = (("x-request-id", request_id),) if request_id else None
        stream = stub.Generate(diffusion_pb2.GenerateRequest(prompt=prompt, num_steps=num_steps), metadata=metadata)
        messages = [message async for message in stream]
        return messages, await stream.trailing_metadata()


@pytest.mark.parametrize(
    ("prompt", "code", "message"),
    [
        ("invalid", grpc.StatusCode.INVALID_ARGUMENT, "prompt: 'invalid' is not allowed"),
        ("busy", grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"),
        ("crash", grpc.StatusCode.INTERNAL, "internal error"),
    ],
)
async def test_error_boundary_maps_exceptions_to_status_codes(host, prompt, code, message):
    host, service, starting = host
    service.warm.set()
    await starting
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await call(host, prompt)
    assert failure.value.code() == code
    assert failure.value.details() == message
    assert "Traceback" not in failure.value.details() and "secret" not in failure.value.details()


async def test_error_boundary_covers_unary_calls_and_echoes_the_request_id(host):
    host, service, starting = host
    service.warm.set()
    await starting
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        stub = diffusion_pb2_grpc.DiffusionStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await stub.GetLoad(common_pb2.GetLoadRequest(), metadata=(("x-request-id", "req-42"),))
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    assert ("x-request-id", "req-42") in tuple(failure.value.trailing_metadata())


async def test_metrics_endpoint_serves_rpc_counts(host):
    host, service, starting = host
    service.warm.set()
    await starting
    await call(host, "fine", num_steps=1, request_id="req-metrics")
    async with httpx.AsyncClient() as client:
        body = (await client.get(f"http://127.0.0.1:{host.metrics_port}/metrics")).text
    assert 'chorus_rpcs_total{code="OK",method="Generate",service="ticker"}' in body
    assert 'chorus_serving{service="ticker"} 1.0' in body


async def test_graceful_stop_finishes_the_in_flight_stream_then_refuses_new_calls(host):
    host, service, starting = host
    service.warm.set()
    await starting
    in_flight = asyncio.create_task(call(host, "long", num_steps=10))  # ~0.5 s, inside the 2 s grace
    await asyncio.sleep(0.15)
    await host.stop()
    messages, _ = await in_flight
    assert [m.progress.step for m in messages[:-1]] == list(range(1, 11))
    assert messages[-1].final.reason == common_pb2.FINISH_REASON_COMPLETE
    assert service.closed
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(host, "late", num_steps=1)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_failed_drain_is_raised_after_the_server_stopped_and_the_service_closed(host):
    host, service, starting = host
    service.warm.set()
    await starting
    service.drain_error = RuntimeError("drain failed")
    with pytest.raises(RuntimeError, match="drain failed"):
        await host.stop()
    service.drain_error = None
    assert service.closed, "before the fix the failed drain skipped the close"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(host, "late", num_steps=1)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_graceful_stop_cancels_streams_that_outlive_the_grace_period(host):
    host, service, starting = host
    service.warm.set()
    await starting
    in_flight = asyncio.create_task(call(host, "endless", num_steps=1000))
    await asyncio.sleep(0.15)
    await host.stop()  # grace 2 s
    with pytest.raises(grpc.aio.AioRpcError) as cancelled:
        await in_flight
    assert cancelled.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


async def test_a_service_does_not_start_on_a_port_another_process_shares():
    # A REST server's socket with SO_REUSEPORT (as the gateway's) once held the port a talker was given: the talker
    # bound it too and the kernel split connections between them. A backend must refuse the port instead.
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        host = ServiceHost(ServiceConfig(port=port, metrics_port=-1), TickerService())
        with pytest.raises(RuntimeError, match=f"ticker cannot listen on 127.0.0.1:{port}"):
            await asyncio.wait_for(host.start(), timeout=10)  # bound it: started, it would wait to warm up
        await host.server.stop(None)
    finally:
        holder.close()

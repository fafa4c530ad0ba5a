"""The process host every Chorus service runs in.

It owns what is the same everywhere — the grpc.aio server with the error boundary, health
(NOT_SERVING until the service is warm), reflection, the /metrics endpoint, signals and drain —
so a service only registers its servicer and says how to start and close. Lifecycle:

1. start: bind gRPC + metrics → `service.start()` (load, warm up) → health SERVING.
2. wait for SIGTERM / SIGINT (a second signal exits at once).
3. stop: health NOT_SERVING → stop accepting calls, let in-flight ones finish within `grace_s`,
   cancel the rest → `service.close()` → exit 0.
"""

from __future__ import annotations

import abc
import asyncio
import gc
import logging
import os
import signal
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from chorus.runtime.boundary import ErrorBoundary
from chorus.runtime.channels import server_options
from chorus.runtime.config import ServiceConfig
from chorus.runtime.gc_pauses import watch_gc_pauses
from chorus.runtime.loop_lag import watch_loop_lag
from chorus.runtime.metrics import SERVING, serve_metrics
from chorus.runtime.tasks import cancel_and_wait

log = logging.getLogger("chorus.host")


class Service(abc.ABC):
    """What one Chorus process serves."""

    #: Short name for logs and metrics ("talker", "gateway", …).
    name: str
    #: Full gRPC service names (e.g. "chorus.v1.Talker"), reported by health and reflection.
    grpc_services: tuple[str, ...]
    #: Whether processes of this service share one port (SO_REUSEPORT, gRPC's default): gateway workers do. Any
    #: other service fails to start on a port something holds, instead of splitting its calls with that.
    shares_port: bool = False

    @abc.abstractmethod
    def register(self, server: grpc.aio.Server) -> None:
        """Adds the servicers to the server (called before it starts)."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Loads models and warms up; health turns SERVING when this returns."""

    async def drain(self) -> None:  # noqa: B027 - optional hook
        """Stopping: called once health says NOT_SERVING, before in-flight calls get their grace period."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Frees resources once no call is running."""


class ServiceHost:
    def __init__(self, config: ServiceConfig, service: Service) -> None:
        self.config = config
        self.service = service
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=[ErrorBoundary(service.name)],
            options=[*server_options(config.max_message_bytes), ("grpc.so_reuseport", int(service.shares_port))],
        )
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._loop_lag: asyncio.Task | None = None

    async def start(self) -> None:
        self.service.register(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (*self.service.grpc_services, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.server)
        await self._set_serving(False)
        address = f"{self.config.host}:{self.config.port}"
        try:
            self.port = self.server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc says only "Failed to bind"
            raise RuntimeError(f"{self.service.name} cannot listen on {address} (in use?): {exc}") from None
        await self.server.start()
        self.metrics_port = serve_metrics(self.config.host, self.config.metrics_port)
        log.info(
            "%s listening on %s:%d (metrics port %s); warming up",
            self.service.name,
            self.config.host,
            self.port,
            self.metrics_port,
        )
        await self.service.start()
        # What is alive after warm-up (modules, weights, compiled graphs) lives as long as the process; left to
        # the cyclic collector, every full collection scans all of it again with the GIL held, which stalls
        # every stream of the process at once.
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        watch_gc_pauses()
        self._loop_lag = asyncio.create_task(watch_loop_lag(), name="loop-lag")
        log.info(
            "%s: %d objects from warm-up exempt from garbage collection (a full collection took %.0f ms)",
            self.service.name, gc.get_freeze_count(), (time.perf_counter() - started) * 1000,
        )  # fmt: skip
        await self._set_serving(True)
        log.info("%s is SERVING", self.service.name)

    async def stop(self) -> None:
        log.info("%s draining (grace %.1f s)", self.service.name, self.config.grace_s)
        await self._set_serving(False)
        try:
            await self.service.drain()
        finally:  # a failed drain still stops the calls and frees the service's resources; its error goes on up
            await self.server.stop(self.config.grace_s)
            await self.service.close()
            if self._loop_lag is not None:
                await cancel_and_wait([self._loop_lag], "loop lag watch")
        log.info("%s stopped", self.service.name)

    async def _set_serving(self, is_serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if is_serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service.grpc_services):
            await self.health.set(name, status)
        SERVING.labels(self.service.name).set(int(is_serving))

    async def serve_until_signalled(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            if stop.is_set():
                log.warning("second %s: exiting now", signal.Signals(signum).name)
                os._exit(1)
            log.info("received %s", signal.Signals(signum).name)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal, signum)
        await self.start()
        await stop.wait()
        await self.stop()


def run(config: ServiceConfig, build_service: Callable[[ServiceConfig], Service]) -> None:
    """Entry point of `chorus serve <service>`: runs until SIGTERM/SIGINT, then exits 0."""
    import uvloop

    async def main() -> None:
        await ServiceHost(config, build_service(config)).serve_until_signalled()

    uvloop.run(main())

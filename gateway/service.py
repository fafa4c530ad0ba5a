"""The gateway process: REST (uvicorn) and the public gRPC API in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket

import grpc
import uvicorn

from chorus.gateway.config import GatewayConfig
from chorus.gateway.context import GatewayContext
from chorus.gateway.jobs import continue_run
from chorus.gateway.public_api import ChorusServicer
from chorus.gateway.rest import create_app
from chorus.gateway.state.redis_url import redacted
from chorus.runtime.heap import keep_large_buffers_mapped
from chorus.runtime.host import Service
from chorus.v1 import gateway_pb2_grpc

log = logging.getLogger("chorus.gateway")


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handlers: the service host owns signals and drain."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class GatewayService(Service):
    name = "gateway"
    grpc_services = ("chorus.v1.Chorus",)
    shares_port = True  # workers on one host take the same ports

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.context = GatewayContext.from_config(config)
        self.rest_port: int | None = None
        self._rest: _EmbeddedUvicorn | None = None
        self._rest_task: asyncio.Task | None = None

    def register(self, server: grpc.aio.Server) -> None:
        gateway_pb2_grpc.add_ChorusServicer_to_server(ChorusServicer(self.context), server)

    async def start(self) -> None:
        keep_large_buffers_mapped()  # text-to-audio results arrive as multi-MB messages: see chorus.runtime.heap
        self.context.backends.start()
        self.context.broker.start(lambda entry: continue_run(self.context, entry))
        app = create_app(self.context)
        rest_config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=self.config.grace_s,
            timeout_keep_alive=self.config.rest_keep_alive_s,
        )
        self._rest = _EmbeddedUvicorn(rest_config)
        self._rest_task = asyncio.create_task(self._rest.serve(sockets=[self._rest_socket()]), name="rest")
        while not self._rest.started:
            if self._rest_task.done():
                raise RuntimeError(f"REST server failed to start on {self.config.rest_host}:{self.config.rest_port}")
            await asyncio.sleep(0.02)
        self.rest_port = self._rest.servers[0].sockets[0].getsockname()[1]
        log.info("REST API on http://%s:%d", self.config.rest_host, self.rest_port)
        log.info("request state in Redis at %s", redacted(self.config.redis_url))

    def _rest_socket(self) -> socket.socket:
        """The REST listening socket, shared the way gRPC shares its port by default (SO_REUSEPORT): gateway
        workers on one host take the same port and the kernel spreads connections over them."""
        host, port = self.config.rest_host, self.config.rest_port
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"REST server cannot listen on {host}:{port}: {exc}") from None
        return sock

    async def drain(self) -> None:
        """SIGTERM: take no new requests, and hand every live run to the other gateway processes (readers here
        follow the runs' journals until they end or the grace period runs out)."""
        await self.context.broker.hand_over()

    async def close(self) -> None:
        await self.context.broker.close()
        if self._rest is not None:
            self._rest.should_exit = True
            await self._rest_task
        await self.context.runs.close()
        await self.context.cancels.close()
        await self.context.backends.close()
        await self.context.redis.aclose()
        self.context.encoder_threads.shutdown(wait=False, cancel_futures=True)

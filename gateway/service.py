"""The gateway process: REST (uvicorn) and the public gRPC API in one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
import uvicorn

from chorus.gateway.config import GatewayConfig
from chorus.gateway.context import GatewayContext
from chorus.gateway.public_api import ChorusServicer
from chorus.gateway.rest import create_app
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

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.context = GatewayContext.from_config(config)
        self.rest_port: int | None = None
        self._rest: _EmbeddedUvicorn | None = None
        self._rest_task: asyncio.Task | None = None

    def register(self, server: grpc.aio.Server) -> None:
        gateway_pb2_grpc.add_ChorusServicer_to_server(ChorusServicer(self.context), server)

    async def start(self) -> None:
        self.context.backends.start()
        app = create_app(self.context)
        rest_config = uvicorn.Config(
            app,
            host=self.config.rest_host,
            port=self.config.rest_port,
            log_config=None,
            access_log=False,
            lifespan="off",
        )
        self._rest = _EmbeddedUvicorn(rest_config)
        self._rest_task = asyncio.create_task(self._rest.serve(), name="rest")
        while not self._rest.started:
            if self._rest_task.done():  # e.g. the port is taken
                raise RuntimeError(f"REST server failed to start on {self.config.rest_host}:{self.config.rest_port}")
            await asyncio.sleep(0.02)
        self.rest_port = self._rest.servers[0].sockets[0].getsockname()[1]
        log.info("REST API on http://%s:%d", self.config.rest_host, self.rest_port)

    async def close(self) -> None:
        if self._rest is not None:
            self._rest.should_exit = True
            await self._rest_task
        await self.context.runs.close()
        await self.context.cancels.close()
        await self.context.backends.close()
        await self.context.redis.aclose()

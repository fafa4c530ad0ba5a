"""Backend replicas and their health, as the gateway sees them.

Each replica gets one long-lived channel and a task that checks its gRPC health every
`interval_s`. A replica that fails the check stops counting as healthy until it passes again.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.channels import open_channel
from chorus.services import SERVICES

log = logging.getLogger("chorus.gateway.backends")


class Replica:
    def __init__(self, kind: str, grpc_service: str, target: str) -> None:
        self.kind = kind
        self.grpc_service = grpc_service
        self.target = target
        self.channel = open_channel(target)
        self.is_healthy = False
        self._health = health_pb2_grpc.HealthStub(self.channel)

    async def check(self, timeout_s: float) -> bool:
        try:
            request = health_pb2.HealthCheckRequest(service=self.grpc_service)
            reply = await self._health.Check(request, timeout=timeout_s)
            is_healthy = reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.aio.AioRpcError:
            is_healthy = False
        if is_healthy != self.is_healthy:
            log.info("%s replica %s is now %s", self.kind, self.target, "healthy" if is_healthy else "unhealthy")
        self.is_healthy = is_healthy
        return is_healthy


class BackendPool:
    """All replicas of all backends, kept health-checked in the background."""

    def __init__(self, targets: dict[str, tuple[str, ...]], interval_s: float) -> None:
        self.replicas = {
            kind: [Replica(kind, SERVICES[kind].grpc_service, target) for target in kind_targets]
            for kind, kind_targets in targets.items()
        }
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="backend-health")

    async def _watch(self) -> None:
        all_replicas = [replica for replicas in self.replicas.values() for replica in replicas]
        while True:
            await asyncio.gather(*(replica.check(timeout_s=self.interval_s) for replica in all_replicas))
            await asyncio.sleep(self.interval_s)

    def status(self) -> dict[str, dict[str, bool]]:
        return {kind: {r.target: r.is_healthy for r in replicas} for kind, replicas in self.replicas.items()}

    def is_ready(self) -> bool:
        """True when every backend kind has at least one healthy replica."""
        return all(any(r.is_healthy for r in replicas) for replicas in self.replicas.values())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for replicas in self.replicas.values():
            for replica in replicas:
                await replica.channel.close()

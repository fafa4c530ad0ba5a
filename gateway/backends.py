"""Backend replicas, their health and load, as the gateway sees them.

Each replica gets one long-lived channel and a task that checks its gRPC health (and reads its
`GetLoad` report) every `interval_s`. A replica that fails the check stops counting as healthy
until it passes again (one that is only slow to answer, after a few checks in a row); so does one
that broke a stream (`failed`), at once. New work goes to the least-loaded healthy replica that is
not draining; a stream failing over waits a while for one (`acquire`), e.g. while a replica restarts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.channels import open_channel
from chorus.runtime.errors import Unavailable
from chorus.runtime.tasks import exit_if_it_fails
from chorus.services import SERVICES
from chorus.v1 import common_pb2, diffusion_pb2_grpc, talker_pb2_grpc, vocoder_pb2_grpc

_STUBS = {
    "talker": talker_pb2_grpc.TalkerStub,
    "vocoder": vocoder_pb2_grpc.VocoderStub,
    "diffusion": diffusion_pb2_grpc.DiffusionStub,
}

log = logging.getLogger("chorus.gateway.backends")
SLOW_CHECKS_TO_FAIL = 3


class Replica:
    def __init__(self, kind: str, grpc_service: str, target: str) -> None:
        self.kind = kind
        self.grpc_service = grpc_service
        self.target = target
        self.channel = open_channel(target)
        self.is_healthy = False
        self._slow_checks = 0  # consecutive checks that timed out
        self.num_active = 0  # streams this gateway has open to the replica
        self.num_opened_since_report = 0  # of those, opened after the last load report (which counts the rest)
        self.load: common_pb2.LoadReport | None = None  # the last report; None until one arrives
        # Streams it serves at once (live + free slots), by its last report: kept while a report fails to arrive.
        self.capacity: int | None = None
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.stub = _STUBS[kind](self.channel)

    @property
    def load_score(self) -> int:
        """Streams running or queued on the replica: its last report, plus those this gateway opened since (the
        report counts the older ones already: adding every open stream would count them twice)."""
        if self.load is None:
            return self.num_active
        return self.load.live_streams + self.load.queue_depth + self.num_opened_since_report

    async def check(self, timeout_s: float) -> bool:
        """One health check. A NOT_SERVING answer or a refused connection counts at once; a check that only
        ran out of time (a busy replica or host) counts after `SLOW_CHECKS_TO_FAIL` in a row: slow is not dead."""
        try:
            request = health_pb2.HealthCheckRequest(service=self.grpc_service)
            reply = await self._health.Check(request, timeout=timeout_s)
            is_healthy = reply.status == health_pb2.HealthCheckResponse.SERVING
            self._slow_checks = 0
        except grpc.aio.AioRpcError as error:
            timed_out = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            self._slow_checks = self._slow_checks + 1 if timed_out else 0
            is_healthy = self.is_healthy and 0 < self._slow_checks < SLOW_CHECKS_TO_FAIL
        if is_healthy != self.is_healthy:
            log.info("%s replica %s is now %s", self.kind, self.target, "healthy" if is_healthy else "unhealthy")
        self.is_healthy = is_healthy
        if is_healthy:
            try:
                opened_before = self.num_opened_since_report
                self.load = await self.stub.GetLoad(common_pb2.GetLoadRequest(), timeout=timeout_s)
                self.num_opened_since_report -= opened_before  # counted by this report
                self.capacity = self.load.live_streams + self.load.free_slots
            except grpc.aio.AioRpcError:
                self.load = None
        return is_healthy

    async def probe(self, timeout_s: float) -> bool:
        """Whether the replica answers SERVING within `timeout_s` (no slow-check leniency: a stream is waiting)."""
        try:
            request = health_pb2.HealthCheckRequest(service=self.grpc_service)
            reply = await self._health.Check(request, timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


class BackendPool:
    """All replicas of all backends, kept health-checked in the background."""

    def __init__(self, targets: dict[str, tuple[str, ...]], interval_s: float) -> None:
        self.replicas = {
            kind: [Replica(kind, SERVICES[kind].grpc_service, target) for target in kind_targets]
            for kind, kind_targets in targets.items()
        }
        self.interval_s = interval_s
        #: Called with a replica's kind after each of its checks (admission limits that follow the load reports).
        self.on_checked: Callable[[str], None] = lambda kind: None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = exit_if_it_fails(asyncio.create_task(self._watch(), name="backend-health"), "backend health")

    async def _watch(self) -> None:
        all_replicas = [replica for replicas in self.replicas.values() for replica in replicas]
        while True:
            await asyncio.gather(*(self._check(replica) for replica in all_replicas))
            await asyncio.sleep(self.interval_s)

    async def _check(self, replica: Replica) -> None:
        await replica.check(timeout_s=self.interval_s)
        self.on_checked(replica.kind)

    def status(self) -> dict[str, dict[str, bool]]:
        return {kind: {r.target: r.is_healthy for r in replicas} for kind, replicas in self.replicas.items()}

    def pick(self, kind: str) -> Replica:
        """The least-loaded healthy replica of `kind` that is not draining."""
        candidates = [
            replica
            for replica in self.replicas[kind]
            if replica.is_healthy and not (replica.load is not None and replica.load.is_draining)
        ]
        if not candidates:
            raise Unavailable(f"no healthy {kind} replica; retry later")
        return min(candidates, key=lambda replica: replica.load_score)

    async def acquire(self, kind: str, wait_s: float) -> Replica:
        """`pick`, waiting up to `wait_s` for a healthy replica; the replica counts the stream until `release`."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                replica = self.pick(kind)
                break
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(0.1, self.interval_s))
        replica.num_active += 1
        replica.num_opened_since_report += 1
        return replica

    def release(self, replica: Replica) -> None:
        replica.num_active -= 1

    def failed(self, replica: Replica) -> None:
        """`replica` broke a stream: no new work for it until its next health check passes."""
        if replica.is_healthy:
            log.info("%s replica %s is now unhealthy (it broke a stream)", replica.kind, replica.target)
        replica.is_healthy = False

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

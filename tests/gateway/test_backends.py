"""Replica choice: the least-loaded healthy replica that is not draining, from real health and load RPCs."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from chorus.gateway.backends import SLOW_CHECKS_TO_FAIL, BackendPool
from chorus.runtime.errors import Unavailable
from chorus.v1 import common_pb2, talker_pb2_grpc


class ReportingTalker(talker_pb2_grpc.TalkerServicer):
    """Only the load report of the contract: what a talker replica says about its load."""

    def __init__(self) -> None:
        self.report = common_pb2.LoadReport()

    async def GetLoad(self, request, context):
        return self.report


async def start_replica(port: int = 0):
    talker, health_servicer = ReportingTalker(), health.aio.HealthServicer()
    server = grpc.aio.server()
    talker_pb2_grpc.add_TalkerServicer_to_server(talker, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await health_servicer.set("chorus.v1.Talker", health_pb2.HealthCheckResponse.SERVING)
    return server, talker, health_servicer, f"127.0.0.1:{port}"


async def settle(pool: BackendPool, predicate) -> None:
    for _ in range(100):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the pool did not catch up")


async def test_least_loaded_healthy_replica_gets_the_work():
    replicas = [await start_replica() for _ in range(3)]
    pool = BackendPool({"talker": tuple(r[3] for r in replicas)}, interval_s=0.05)
    by_target = {replica.target: replica for replica in pool.replicas["talker"]}
    pool.start()
    try:
        replicas[0][1].report = common_pb2.LoadReport(live_streams=5, queue_depth=2)
        replicas[1][1].report = common_pb2.LoadReport(live_streams=1)
        replicas[2][1].report = common_pb2.LoadReport(live_streams=0, is_draining=True)
        await settle(pool, lambda: by_target[replicas[0][3]].load_score == 7)
        assert pool.pick("talker").target == replicas[1][3]  # replica 2 is idle but draining

        by_target[replicas[1][3]].num_opened_since_report = 10  # streams this gateway opened since its report
        assert pool.pick("talker").target == replicas[0][3]

        await replicas[0][2].set("chorus.v1.Talker", health_pb2.HealthCheckResponse.NOT_SERVING)
        await settle(pool, lambda: not by_target[replicas[0][3]].is_healthy)
        assert pool.pick("talker").target == replicas[1][3]

        await replicas[1][0].stop(None)
        await settle(pool, lambda: not by_target[replicas[1][3]].is_healthy)
        with pytest.raises(Unavailable, match="talker"):
            pool.pick("talker")
    finally:
        await pool.close()
        for server, *_ in replicas:
            await server.stop(None)


class SlowHealth(health_pb2_grpc.HealthServicer):
    """Answers SERVING, but the next `slow_answers` checks only after `delay_s` (a busy replica or host)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.slow_answers, self.num_checks = delay_s, 0, 0

    async def Check(self, request, context):
        self.num_checks += 1
        if self.slow_answers:
            self.slow_answers -= 1
            await asyncio.sleep(self.delay_s)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


async def test_a_slow_check_is_not_a_dead_replica_but_a_run_of_them_is():
    slow_health, server = SlowHealth(delay_s=0.3), grpc.aio.server()
    talker_pb2_grpc.add_TalkerServicer_to_server(ReportingTalker(), server)
    health_pb2_grpc.add_HealthServicer_to_server(slow_health, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    pool = BackendPool({"talker": (f"127.0.0.1:{port}",)}, interval_s=0.05)
    replica = pool.replicas["talker"][0]
    pool.start()
    try:
        await settle(pool, lambda: replica.is_healthy)
        slow_health.slow_answers = SLOW_CHECKS_TO_FAIL - 1
        checks_before, seen_unhealthy = slow_health.num_checks, []

        def slow_checks_done() -> bool:
            seen_unhealthy.append(not replica.is_healthy)
            return slow_health.num_checks > checks_before + SLOW_CHECKS_TO_FAIL

        await settle(pool, slow_checks_done)
        assert not any(seen_unhealthy), "timed-out checks short of the limit keep the replica in rotation"
        slow_health.slow_answers = 100
        await settle(pool, lambda: not replica.is_healthy)
        slow_health.slow_answers = 0
        await settle(pool, lambda: replica.is_healthy)
    finally:
        await pool.close()
        await server.stop(None)


async def test_a_replica_back_after_a_long_outage_is_taken_back_within_a_second_or_so():
    """gRPC's own reconnect backoff grows to 120 s; the gateway's channels cap it, so a backend restarted after
    minutes (a crash, a model reload) is back in rotation about a second after it serves again."""
    server, _, _, target = await start_replica()
    pool = BackendPool({"talker": (target,)}, interval_s=0.2)
    replica = pool.replicas["talker"][0]
    pool.start()
    try:
        await settle(pool, lambda: replica.is_healthy)
        await server.stop(None)
        await settle(pool, lambda: not replica.is_healthy)
        await asyncio.sleep(12.0)  # default backoff: reconnects at about 5, 9, 16 s after the loss
        server, *_ = await start_replica(port=int(target.rsplit(":", 1)[1]))
        started = time.monotonic()
        while not replica.is_healthy:
            assert time.monotonic() - started < 2.5, "the replica was not taken back within 2.5 s"
            await asyncio.sleep(0.02)
        print(f"replica back in rotation {time.monotonic() - started:.2f} s after it served again")
    finally:
        await pool.close()
        await server.stop(None)

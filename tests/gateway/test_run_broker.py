"""The run broker: it stops when its loop's Redis command drops the close's cancel (Python 3.11's `wait_for`),
and a drain leaves no run claimed or started by the tick under way, nor started by a request admitted meanwhile
(against a real redis-server)."""

from __future__ import annotations

import asyncio
import time
import uuid

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from chorus.gateway.jobs import DIFFUSION_MODEL, start_generation
from chorus.gateway.run_broker import RunBroker
from chorus.gateway.runner import RunRegistry
from chorus.gateway.schemas import GenerationRequest
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.requests import RequestStore
from chorus.gateway.state.runs import RunEntry, RunQueue


class LateReplyQueue:
    """A run queue whose heartbeat replies when the test says, through `asyncio.wait_for` as redis-py sends."""

    consumer = "gateway-under-test"
    lease_s = 0.04

    def __init__(self) -> None:
        self.reply: asyncio.Future | None = None
        self.in_heartbeat = asyncio.Event()

    async def heartbeat(self) -> set[str]:
        self.reply = asyncio.get_running_loop().create_future()
        self.in_heartbeat.set()
        return await asyncio.wait_for(self.reply, timeout=10)

    async def reclaim(self) -> list:
        return []


async def test_close_returns_when_the_heartbeat_drops_its_cancel():
    queue = LateReplyQueue()
    broker = RunBroker(queue, RunRegistry(journal=None))
    broker.start(continue_run=None)
    await queue.in_heartbeat.wait()
    queue.reply.set_result(set())  # Redis answers in the loop iteration the close cancels: the cancel is dropped
    started_s = time.monotonic()
    async with asyncio.timeout(5):  # before the fix the close waited forever (CI: until pytest's 300 s timeout)
        await broker.close()
    assert time.monotonic() - started_s < 3 and broker._loop.done()


class ParkedRun:
    """A run taken over that would run until stopped."""

    entry_id: str | None = None

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id

    async def run(self) -> str:
        await asyncio.Event().wait()

    def hand_over(self, task: asyncio.Task) -> None:
        task.cancel()


async def test_a_tick_under_way_when_the_drain_begins_claims_and_starts_nothing(redis_url):
    client = open_redis(redis_url)
    stream = f"chorus:runs:{uuid.uuid4().hex}"
    dead, draining, other = (RunQueue(client, name, 0.2, stream) for name in ("dead", "draining", "other"))
    _, fields = RequestStore(client).new_record("speech", "m")
    _, entry_id = await dead.admit(fields, b"spec", 60, None)
    await dead.release([entry_id])  # its process stopped: the run is free for the taking
    in_take_over, drain_began = asyncio.Event(), asyncio.Event()

    async def continue_run(entry: RunEntry) -> ParkedRun:
        in_take_over.set()  # claimed by XAUTOCLAIM; now reading the run's journal
        await drain_began.wait()
        return ParkedRun(entry.request_id)

    broker = RunBroker(draining, RunRegistry(journal=None))
    broker.start(continue_run)
    try:
        async with asyncio.timeout(5):
            await in_take_over.wait()
            handing_over = asyncio.create_task(broker.hand_over())
            await asyncio.sleep(0)  # the drain has begun
            drain_began.set()
            await handing_over
        # Before the fix the tick started the run after the hand-over, and kept its entry from the others.
        assert [entry.entry_id for entry in await other.reclaim()] == [entry_id], "handed on to the others at once"
        assert broker.runs.live_runs() == [], "the drain began before the take-over could start its run"
    finally:
        await broker.close()
        await broker.runs.close()
        await client.aclose()


async def test_a_request_that_waited_for_its_slot_past_the_drain_goes_to_the_other_processes(start_gateway, redis_url):
    backend, health_servicer = aio.server(), health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, backend)
    target = (f"127.0.0.1:{backend.add_insecure_port('127.0.0.1:0')}",)  # a healthy diffusion backend, as far as seen
    await backend.start()
    await health_servicer.set("chorus.v1.Diffusion", health_pb2.HealthCheckResponse.SERVING)
    config = dict(health_interval_s=0.1, diffusion_targets=target, diffusion_max_in_flight=1)
    try:
        async with start_gateway(redis_url, **config) as (gateway, _, _), asyncio.timeout(10):
            ctx = gateway.context
            while not any(replica.is_healthy for replica in ctx.backends.replicas["diffusion"]):
                await asyncio.sleep(0.05)
            body = GenerationRequest(model=DIFFUSION_MODEL, prompt="rain on a tin roof")
            async with ctx.admission.enter("diffusion"):  # the one slot is busy: the request waits for it
                admitting = asyncio.create_task(start_generation(ctx, body, "", None, is_detachable=False))
                while ctx.admission.backends["diffusion"].queue_depth == 0:
                    await asyncio.sleep(0.01)
                await gateway.drain()  # SIGTERM's hand-over: this process's runs are listed and released
            record = await admitting
            other = RunQueue(ctx.broker.queue.client, "other", ctx.broker.queue.lease_s, ctx.config.run_queue)
            # Before the fix its run started here after the hand-over, its lease renewed by nobody: the other
            # processes took it only once the lease lapsed.
            assert [entry.request_id for entry in await other.reclaim()] == [record.request_id]
            assert not ctx.runs.is_running(record.request_id)
    finally:
        await backend.stop(None)


def _count(name: str) -> float:
    return REGISTRY.get_sample_value(f"chorus_gateway_{name}_total") or 0.0


async def test_a_run_whose_lease_lapsed_on_a_live_process_counts_as_taken_over_there_and_lost_here(redis_url):
    """A process too busy to renew its run's lease (here: its broker's loop not yet running) loses the run to another
    process; when it next renews, it stops its copy of the run. Both sides count it, so an operator sees leases that
    lapse on live processes (the run's backend work ran twice) without a fault to explain them."""
    client = open_redis(redis_url)
    stream = f"chorus:runs:{uuid.uuid4().hex}"
    busy_queue, other_queue = (RunQueue(client, name, 0.2, stream) for name in ("busy", "other"))
    record, fields = RequestStore(client).new_record("speech", "m")
    _, entry_id = await busy_queue.admit(fields, b"spec", 60, None)
    busy = RunBroker(busy_queue, RunRegistry(journal=None))
    await busy.start_run(ParkedRun(record.request_id), entry_id, None, is_detachable=False)
    taken_over_before, lost_before = _count("runs_taken_over"), _count("runs_lost")
    taken_over = asyncio.Event()

    async def continue_run(entry: RunEntry) -> ParkedRun:
        taken_over.set()
        return ParkedRun(entry.request_id)

    other = RunBroker(other_queue, RunRegistry(journal=None))
    other.start(continue_run)
    try:
        async with asyncio.timeout(5):
            await taken_over.wait()  # after the lease (0.2 s) lapsed with nobody renewing it
            assert busy.runs.is_running(record.request_id), "the busy process still runs its copy"
            busy.start(continue_run=None)  # the busy process gets to its loop again: its next renewal
            while busy.runs.is_running(record.request_id):
                await asyncio.sleep(0.01)
        assert other.runs.is_running(record.request_id)
        assert _count("runs_taken_over") - taken_over_before == 1
        assert _count("runs_lost") - lost_before == 1
    finally:
        for broker in (busy, other):
            await broker.close()
            await broker.runs.close()
        await client.aclose()


class EndingRun(ParkedRun):
    """A run that ends when the test says."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.end = asyncio.Event()

    async def run(self) -> str:
        await self.end.wait()
        return "done"


class RunEndsDuringHeartbeatQueue:
    """A run queue whose heartbeat answers after the run ended and its entry was acknowledged."""

    consumer = "gateway-under-test"
    lease_s = 60.0

    def __init__(self, run: EndingRun, runs: RunRegistry) -> None:
        self.run, self.runs = run, runs
        self.num_heartbeats = 0

    async def heartbeat(self) -> set[str]:
        self.run.end.set()
        while self.runs.is_running(self.run.request_id):
            await asyncio.sleep(0)
        self.num_heartbeats += 1
        return set()  # its entry is gone: acknowledged and deleted

    async def done(self, entry_id: str) -> None:
        """Acknowledges the ended run's entry (the answer above already leaves it out)."""

    async def reclaim(self) -> list:
        return []


async def test_a_run_that_ended_while_its_lease_was_renewed_is_not_counted_lost():
    runs = RunRegistry(journal=None)
    run = EndingRun(f"ended-{uuid.uuid4().hex}")
    queue = RunEndsDuringHeartbeatQueue(run, runs)
    broker = RunBroker(queue, runs)
    await broker.start_run(run, "1-0", None, is_detachable=False)
    lost_before = _count("runs_lost")
    broker.start(continue_run=None)
    try:
        async with asyncio.timeout(5):
            while queue.num_heartbeats == 0:
                await asyncio.sleep(0.01)
        assert _count("runs_lost") == lost_before
    finally:
        await broker.close()
        await runs.close()

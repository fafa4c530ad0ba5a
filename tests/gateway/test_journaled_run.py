"""The lifecycle every run shares, against a real redis-server: the tasks a run starts end with it, a cancel of the
run is never swallowed while it stops them, and a failed run says so in the log."""

from __future__ import annotations

import asyncio
import logging

import pytest

from chorus.gateway.journaled_run import HANDED_OVER, JournaledRun
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import DONE, FAILED, RequestStore
from chorus.runtime.errors import InvalidRequest, Unavailable


class HeldRun(JournaledRun):
    """Produces nothing; holds until `release` is set. Calls `on_stop` when its production is cancelled."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()
        self.is_producing = asyncio.Event()
        self.on_stop = lambda: None

    async def _produce(self) -> dict:
        self.is_producing.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.on_stop()
            raise
        return {"last_sequence": -1}


class FailingRun(JournaledRun):
    """Its production raises `error`."""

    error: Exception

    async def _produce(self) -> dict:
        raise self.error


@pytest.fixture
async def new_run(redis_url):
    client = open_redis(redis_url)
    requests = RequestStore(client)
    cancels = CancelListener(requests)

    async def new_run(kind: type[JournaledRun] = HeldRun) -> JournaledRun:
        record = await requests.create("speech", model="m")
        return kind(requests, OutputJournal(client, requests, block_ms=100), cancels, record.request_id)

    yield new_run
    await cancels.close()
    await client.aclose()


def tasks_of_the_run() -> list[asyncio.Task]:
    """Its cancel watch and its production, while they run."""
    names = {"CancelWatch.wait", "HeldRun._produce"}
    return [task for task in asyncio.all_tasks() if not task.done() and task.get_coro().__qualname__ in names]


async def test_the_cancel_watch_and_the_production_end_with_the_run(new_run):
    async with asyncio.timeout(5):
        run = await new_run()
        running = asyncio.create_task(run.run())
        await run.is_producing.wait()
        assert len(tasks_of_the_run()) == 2
        run.release.set()
        assert await running == DONE
        assert tasks_of_the_run() == [], "before the fix the cancel watch was cancelled, not awaited: still pending"

        run = await new_run()
        running = asyncio.create_task(run.run())
        await run.is_producing.wait()
        run.hand_over(running)
        assert await running == HANDED_OVER
        assert tasks_of_the_run() == [], "a production left running could journal after the hand-over"


async def test_a_cancel_of_the_run_while_it_stops_its_production_is_not_swallowed(new_run):
    async with asyncio.timeout(5):
        run = await new_run()
        running = asyncio.create_task(run.run())
        await run.is_producing.wait()
        run.on_stop = running.cancel  # the run's last reader leaves as a cancel request stops the production
        await run.requests.request_cancel(run.request_id)
        await asyncio.wait([running])
    assert running.cancelled(), "before the fix the run swallowed its own cancel and returned CANCELLED"


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (Unavailable("no vocoder replica answered"), logging.WARNING),  # a backend's failure: the operator's too
        (InvalidRequest("voice: unknown"), logging.INFO),  # the client's own mistake
    ],
)
async def test_a_failed_run_logs_its_request_id_and_why(new_run, caplog, error, level):
    async with asyncio.timeout(5):
        run = await new_run(FailingRun)
        run.error = error
        with caplog.at_level(logging.INFO, logger="chorus.gateway.run"):
            assert await run.run() == FAILED
    [record] = [record for record in caplog.records if f"request {run.request_id} failed" in record.getMessage()]
    assert record.levelno == level and str(error) in record.getMessage()


async def test_a_failed_runs_log_line_names_the_cause_the_client_is_not_told(new_run, caplog):
    """Which Redis error cut a run is the operator's to read (the client's 503 says only that Redis was
    unavailable)."""
    async with asyncio.timeout(5):
        run = await new_run(FailingRun)
        try:
            raise ConnectionResetError("Connection reset by peer")
        except ConnectionResetError as cause:
            run.error = Unavailable("request state store (Redis) is unavailable while journaling output")
            run.error.__cause__ = cause
        with caplog.at_level(logging.INFO, logger="chorus.gateway.run"):
            assert await run.run() == FAILED
        record = await run.requests.get(run.request_id)
    [line] = [r.getMessage() for r in caplog.records if f"request {run.request_id} failed" in r.getMessage()]
    assert "cause: ConnectionResetError('Connection reset by peer')" in line
    assert "reset" not in record.error["message"]

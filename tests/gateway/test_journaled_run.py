"""The lifecycle every run shares, against a real redis-server: the tasks a run starts end with it, and a cancel
of the run is never swallowed while it stops them."""

from __future__ import annotations

import asyncio

import pytest

from chorus.gateway.journaled_run import HANDED_OVER, JournaledRun
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import DONE, RequestStore


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


@pytest.fixture
async def new_run(redis_url):
    client = open_redis(redis_url)
    requests = RequestStore(client)
    cancels = CancelListener(requests)

    async def new_run() -> HeldRun:
        record = await requests.create("speech", model="m")
        return HeldRun(requests, OutputJournal(client, requests, block_ms=100), cancels, record.request_id)

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

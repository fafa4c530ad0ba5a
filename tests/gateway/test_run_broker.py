"""The run broker stops when its loop's Redis command drops the close's cancel (Python 3.11's `wait_for`)."""

from __future__ import annotations

import asyncio
import time

from chorus.gateway.run_broker import RunBroker
from chorus.gateway.runner import RunRegistry


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

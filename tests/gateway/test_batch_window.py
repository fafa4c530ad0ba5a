"""The diffusion batching window: release by time, by size, and cancellation while waiting."""

from __future__ import annotations

import asyncio

import pytest

from chorus.gateway.batch_window import BatchWindow


async def test_requests_inside_the_window_are_released_together():
    window = BatchWindow(window_s=0.1, max_batch_size=8)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = asyncio.create_task(window.join())
    await asyncio.sleep(0.03)
    second = asyncio.create_task(window.join())
    sizes = await asyncio.gather(first, second)
    assert sizes == [2, 2]
    assert 0.09 <= loop.time() - started < 0.3  # held for the window, measured from the first arrival
    later = await asyncio.wait_for(window.join(), timeout=1)  # a new window for a later arrival
    assert later == 1


async def test_a_full_batch_is_released_at_once():
    window = BatchWindow(window_s=10, max_batch_size=3)
    members = [asyncio.create_task(window.join()) for _ in range(4)]
    _, pending = await asyncio.wait(members, timeout=0.5)
    assert [task.result() for task in members[:3]] == [3, 3, 3]
    assert pending == {members[3]}  # opened the next window
    members[3].cancel()
    await asyncio.gather(members[3], return_exceptions=True)


async def test_a_cancelled_member_leaves_and_does_not_count():
    window = BatchWindow(window_s=0.1, max_batch_size=2)
    leaving = asyncio.create_task(window.join())
    await asyncio.sleep(0)
    leaving.cancel()
    await asyncio.gather(leaving, return_exceptions=True)
    staying = asyncio.create_task(window.join())
    await asyncio.sleep(0.02)
    assert not staying.done()  # the cancelled member did not fill the batch of two
    assert await asyncio.wait_for(staying, timeout=1) == 1


def test_bad_settings_name_the_field():
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchWindow(window_s=0.01, max_batch_size=0)
    with pytest.raises(ValueError, match="window_s"):
        BatchWindow(window_s=-1, max_batch_size=1)

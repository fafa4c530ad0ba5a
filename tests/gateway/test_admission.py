"""Admission control: limits, bounded queue, queue timeout, FIFO order, cancellation safety."""

from __future__ import annotations

import asyncio
import random

import pytest

from chorus.gateway.admission import FOLLOW_LIMIT, Admission, BackendAdmission
from chorus.runtime.errors import Overloaded


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_in_flight_limit_holds_and_release_admits_the_next():
    admission = BackendAdmission("talker", max_in_flight=2, max_queued=4, queue_timeout_s=5)
    await admission.acquire()
    await admission.acquire()
    third = asyncio.create_task(admission.acquire())
    await settle()
    assert not third.done() and admission.queue_depth == 1 and admission.num_in_flight == 2
    admission.release()
    await asyncio.wait_for(third, timeout=1)
    assert admission.queue_depth == 0 and admission.num_in_flight == 2


async def test_full_queue_refuses_at_once_with_retry_after():
    admission = BackendAdmission("talker", max_in_flight=1, max_queued=1, queue_timeout_s=5)
    await admission.acquire()
    queued = asyncio.create_task(admission.acquire())
    await settle()
    with pytest.raises(Overloaded) as refused:
        await admission.acquire()
    assert refused.value.retry_after_s >= 1.0
    assert admission.queue_depth == 1
    queued.cancel()
    await asyncio.gather(queued, return_exceptions=True)


async def test_queue_timeout_refuses_and_leaves_the_queue():
    admission = BackendAdmission("diffusion", max_in_flight=1, max_queued=4, queue_timeout_s=0.1)
    await admission.acquire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(Overloaded, match="queue timeout"):
        await admission.acquire()
    assert 0.09 <= loop.time() - started < 0.5
    assert admission.queue_depth == 0 and admission.num_in_flight == 1


async def test_waiters_get_slots_in_arrival_order():
    admission = BackendAdmission("talker", max_in_flight=1, max_queued=10, queue_timeout_s=5)
    await admission.acquire()
    order = []

    async def request(index):
        async with admission.slot():
            order.append(index)
            await asyncio.sleep(0)

    tasks = []
    for index in range(6):
        tasks.append(asyncio.create_task(request(index)))
        await settle()
    # A newcomer while others wait must queue behind them, even if a slot is momentarily free.
    admission.release()
    tasks.append(asyncio.create_task(request(6)))
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=2)
    assert order == list(range(7))
    assert admission.num_in_flight == 0


async def test_cancelled_waiter_leaves_the_queue_without_taking_a_slot():
    admission = BackendAdmission("talker", max_in_flight=1, max_queued=4, queue_timeout_s=5)
    await admission.acquire()
    waiter = asyncio.create_task(admission.acquire())
    await settle()
    assert admission.queue_depth == 1
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert admission.queue_depth == 0 and admission.num_in_flight == 1
    admission.release()
    assert admission.num_in_flight == 0


async def test_waiter_cancelled_just_as_its_slot_arrives_passes_it_on():
    admission = BackendAdmission("talker", max_in_flight=1, max_queued=4, queue_timeout_s=5)
    await admission.acquire()
    first = asyncio.create_task(admission.acquire())
    second = asyncio.create_task(admission.acquire())
    await settle()
    admission.release()  # hands the slot to `first`, which has not resumed yet
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, timeout=1)  # the slot went on to `second`
    assert admission.num_in_flight == 1
    admission.release()
    assert admission.num_in_flight == 0


async def test_random_cancellations_never_leak_slots():
    rng = random.Random(0)
    admission = BackendAdmission("vocoder", max_in_flight=3, max_queued=50, queue_timeout_s=5)
    num_done = 0

    async def request():
        nonlocal num_done
        async with admission.slot():
            await asyncio.sleep(rng.uniform(0, 0.01))
            num_done += 1

    tasks = [asyncio.create_task(request()) for _ in range(40)]
    for _ in range(15):
        await asyncio.sleep(rng.uniform(0, 0.005))
        rng.choice(tasks).cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout=5)
    num_cancelled = sum(isinstance(r, asyncio.CancelledError) for r in results)
    assert num_done + num_cancelled == 40 and num_cancelled > 0
    assert admission.num_in_flight == 0 and admission.queue_depth == 0


async def test_a_higher_limit_admits_waiters_at_once():
    admission = BackendAdmission("talker", max_in_flight=1, max_queued=4, queue_timeout_s=5)
    await admission.acquire()
    waiters = [asyncio.create_task(admission.acquire()) for _ in range(3)]
    await settle()
    admission.resize(3)  # e.g. a second talker replica reported its slots
    await asyncio.wait_for(asyncio.gather(*waiters[:2]), timeout=1)
    assert not waiters[2].done() and admission.num_in_flight == 3 and admission.queue_depth == 1
    admission.release()
    await asyncio.wait_for(waiters[2], timeout=1)
    assert admission.num_in_flight == 3 and admission.queue_depth == 0


async def test_under_a_lower_limit_running_requests_finish_and_waiters_wait_for_room():
    admission = BackendAdmission("talker", max_in_flight=3, max_queued=4, queue_timeout_s=5)
    for _ in range(3):
        await admission.acquire()
    admission.resize(1)  # e.g. one of three replicas left
    waiter = asyncio.create_task(admission.acquire())
    await settle()
    admission.release()
    admission.release()
    await settle()
    assert not waiter.done() and admission.num_in_flight == 1  # the slots freed were over the new limit
    admission.release()
    await asyncio.wait_for(waiter, timeout=1)
    assert admission.num_in_flight == 1 and admission.queue_depth == 0
    with pytest.raises(ValueError, match="max_in_flight"):
        admission.resize(0)


async def test_by_default_the_queue_holds_as_many_as_the_limit_and_follows_it():
    """Clients keeping at most the limit in flight are never refused for a full queue: as many may wait as run."""
    admission = BackendAdmission("talker", max_in_flight=2, max_queued=FOLLOW_LIMIT, queue_timeout_s=5)
    for _ in range(2):
        await admission.acquire()
    waiters = [asyncio.create_task(admission.acquire()) for _ in range(2)]
    await settle()
    assert admission.queue_depth == 2
    with pytest.raises(Overloaded):
        await admission.acquire()
    admission.resize(3)  # one waiter runs; the queue may now hold three
    await asyncio.wait_for(waiters[0], timeout=1)
    more = [asyncio.create_task(admission.acquire()) for _ in range(2)]
    await settle()
    assert admission.queue_depth == 3 and not any(task.done() for task in more)
    with pytest.raises(Overloaded):
        await admission.acquire()
    for task in [waiters[1], *more]:
        task.cancel()
    await asyncio.gather(waiters[1], *more, return_exceptions=True)


async def test_request_enters_every_backend_it_needs():
    admission = Admission(
        {
            "talker": BackendAdmission("talker", max_in_flight=1, max_queued=0, queue_timeout_s=1),
            "vocoder": BackendAdmission("vocoder", max_in_flight=1, max_queued=0, queue_timeout_s=1),
        }
    )
    async with admission.enter("talker", "vocoder"):
        assert admission.backends["talker"].num_in_flight == admission.backends["vocoder"].num_in_flight == 1
        with pytest.raises(Overloaded):
            async with admission.enter("vocoder"):
                pass
    assert admission.backends["talker"].num_in_flight == admission.backends["vocoder"].num_in_flight == 0


def test_bad_limits_name_the_field():
    with pytest.raises(ValueError, match="max_in_flight"):
        BackendAdmission("talker", max_in_flight=0, max_queued=1, queue_timeout_s=1)
    with pytest.raises(ValueError, match="max_queued"):
        BackendAdmission("talker", max_in_flight=1, max_queued=-2, queue_timeout_s=1)

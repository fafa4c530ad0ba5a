"""The admission counts a gateway's worker processes share: together they never hold more than the limit, and a
slot one worker gives back goes to a request waiting on another (real processes and a real mapped file)."""

from __future__ import annotations

import asyncio
import fcntl
import multiprocessing
import random

import pytest

from chorus.gateway import host_slots
from chorus.gateway.admission import HOST_POLL_S, BackendAdmission
from chorus.gateway.host_slots import HostSlots

LIMIT = 3


def _churn(path: str, worker: int, num_workers: int, rounds: int, seed: int) -> int:
    """Takes and gives back slots at random; returns the most slots the workers held together right after a take."""
    slots = HostSlots(path, worker, num_workers)
    rng = random.Random(seed)
    held, most = 0, 0
    for _ in range(rounds):
        if held and rng.random() < 0.5:
            slots.give_back("talker")
            held -= 1
        elif slots.try_take("talker", LIMIT):
            held += 1
            most = max(most, slots.total("talker"))
    for _ in range(held):
        slots.give_back("talker")
    return most


def test_workers_together_never_hold_more_than_the_limit(tmp_path):
    path, num_workers = str(tmp_path / "slots"), 4
    host_slots.create(path, num_workers)
    with multiprocessing.get_context("spawn").Pool(num_workers) as pool:
        most = pool.starmap(_churn, [(path, worker, num_workers, 3000, worker) for worker in range(num_workers)])
    assert max(most) == LIMIT, most  # reached, never passed
    assert HostSlots(path, 0, num_workers).total("talker") == 0


async def test_a_slot_another_worker_gives_back_goes_to_a_request_waiting_here(tmp_path):
    path = str(tmp_path / "slots")
    host_slots.create(path, 2)
    first, second = (BackendAdmission("talker", 2, 8, 5.0, HostSlots(path, worker, 2)) for worker in (0, 1))
    await first.acquire()
    await first.acquire()
    waiting = asyncio.create_task(second.acquire())  # its own count is 0, but the gateway's limit is reached
    await asyncio.sleep(20 * HOST_POLL_S)
    assert not waiting.done() and second.queue_depth == 1
    first.release()
    await asyncio.wait_for(waiting, 20 * HOST_POLL_S)
    assert (first.num_in_flight, second.num_in_flight) == (1, 1)
    assert first.host.total("talker") == 2
    second.release()
    first.release()
    assert first.host.total("talker") == 0


async def test_a_lower_limit_holds_every_worker_back_until_the_gateway_is_under_it(tmp_path):
    path = str(tmp_path / "slots")
    host_slots.create(path, 2)
    first, second = (BackendAdmission("vocoder", 4, 8, 5.0, HostSlots(path, worker, 2)) for worker in (0, 1))
    for admission in (first, first, second, second):
        await admission.acquire()
    for admission in (first, second):
        admission.resize(2)
    waiting = asyncio.create_task(second.acquire())
    first.release()  # 3 held: still over the new limit
    await asyncio.sleep(20 * HOST_POLL_S)
    assert not waiting.done()
    first.release()  # 2 held: the waiter still waits for one under it
    await asyncio.sleep(20 * HOST_POLL_S)
    assert not waiting.done()
    second.release()
    await asyncio.wait_for(waiting, 20 * HOST_POLL_S)
    assert first.host.total("vocoder") == 2


def test_a_take_never_waits_for_the_lock(tmp_path):
    """A worker stopped while it held the lock (SIGSTOP) must not freeze the others: their takes fail instead, and
    their requests wait and try again."""
    path = str(tmp_path / "slots")
    host_slots.create(path, 2)
    slots = HostSlots(path, 0, 2)
    with open(path, "rb") as other_worker:
        fcntl.flock(other_worker, fcntl.LOCK_EX)
        assert not slots.try_take("talker", 8)
        fcntl.flock(other_worker, fcntl.LOCK_UN)
    assert slots.try_take("talker", 8) and slots.total("talker") == 1


def test_a_worker_starting_again_zeroes_its_own_counts(tmp_path):
    path = str(tmp_path / "slots")
    host_slots.create(path, 2)
    before, other = HostSlots(path, 0, 2), HostSlots(path, 1, 2)
    assert before.try_take("diffusion", 8) and other.try_take("diffusion", 8)
    assert HostSlots(path, 0, 2).total("diffusion") == 1  # worker 0 again: only worker 1's slot is held
    with pytest.raises(ValueError, match="worker"):
        HostSlots(path, 2, 2)


def test_a_gateway_of_one_process_has_no_host_counts(tmp_path):
    assert HostSlots.from_environ({}) is None
    path = str(tmp_path / "slots")
    host_slots.create(path, 3)
    slots = HostSlots.from_environ(host_slots.worker_environ(path, 2, 3))
    assert (slots.worker, slots.num_workers) == (2, 3)

"""Admission policy: batching window, slot accounting, FIFO order, bounded queue."""

from __future__ import annotations

import pytest

from chorus.diffusion.engine.scheduler import BatchScheduler, Entry
from chorus.runtime.errors import Overloaded


def _scheduler(**kwargs) -> BatchScheduler[Entry]:
    return BatchScheduler(**{"max_batch_size": 4, "batch_window_s": 0.02, "max_queue_size": 3, **kwargs})


def test_first_request_waits_for_the_window():
    scheduler = _scheduler()
    first = Entry("a", 1, arrival_s=10.0)
    scheduler.add(first)
    assert scheduler.admit(10.01) == [] and scheduler.seconds_until_admission(10.01) == pytest.approx(0.01)
    second = Entry("b", 2, arrival_s=10.015)
    scheduler.add(second)
    assert scheduler.admit(10.02) == [first, second]
    assert scheduler.num_free_slots == 1 and scheduler.queue_depth == 0


def test_without_a_window_a_lone_request_starts_on_arrival():
    scheduler = _scheduler(batch_window_s=0.0)
    lone = Entry("a", 1, arrival_s=10.0)
    scheduler.add(lone)
    assert scheduler.seconds_until_admission(10.0) == 0.0 and scheduler.admit(10.0) == [lone]
    # Those arriving while it runs are admitted at once too (they join at the engine's next step).
    late = Entry("b", 2, arrival_s=10.001)
    scheduler.add(late)
    assert scheduler.admit(10.001) == [late] and scheduler.num_free_slots == 1


def test_a_full_batch_starts_without_waiting():
    scheduler = _scheduler()
    entries = [Entry("a", 2, 0.0), Entry("b", 2, 0.0)]
    for entry in entries:
        scheduler.add(entry)
    assert scheduler.admit(0.0) == entries


def test_running_batches_admit_at_once_in_fifo_order_within_free_slots():
    scheduler = _scheduler(batch_window_s=10.0)
    running = Entry("a", 3, 0.0)
    scheduler.add(running)
    assert scheduler.admit(10.0) == [running]
    big, small = Entry("big", 2, 11.0), Entry("small", 1, 11.0)
    scheduler.add(big)
    scheduler.add(small)
    # The head does not fit; the smaller one behind it waits too, so big requests are not starved.
    assert scheduler.admit(11.0) == []
    scheduler.remove(running)
    # Idle again: the window counts from the oldest waiting request's arrival.
    assert scheduler.admit(11.0) == [] and scheduler.admit(21.0) == [big, small]


def test_remove_frees_slots_and_queue_is_bounded():
    scheduler = _scheduler(max_queue_size=2)
    a, b = Entry("a", 1, 0.0), Entry("b", 1, 0.0)
    scheduler.add(a)
    scheduler.add(b)
    with pytest.raises(Overloaded):
        scheduler.add(Entry("c", 1, 0.0))
    scheduler.remove(b)
    assert scheduler.queue_depth == 1
    assert scheduler.admit(1.0) == [a]
    scheduler.remove(a)
    assert scheduler.num_free_slots == 4 and not scheduler.running


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="max_batch_size"):
        _scheduler(max_batch_size=0)
    with pytest.raises(ValueError, match="batch_window_s"):
        _scheduler(batch_window_s=-1.0)

"""Admission policy: a bounded FIFO queue, a batching window, and slots counted in samples. No torch.

While a batch runs, waiting requests join it at the next step as soon as slots are free, whatever their step
counts: every sample advances on its own schedule, so a short request never waits for a long one to finish.
So requests arriving together end up in one batch without any window (the first starts at once, the rest join
one step later). A `batch_window_s` above 0 only aligns them: when nothing runs, the oldest waiting request
waits up to that long for others, unless the waiting requests already fill the batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from chorus.runtime.errors import Overloaded


@dataclass(slots=True)
class Entry:
    """A request as the scheduler sees it: an id, how many slots it needs, when it arrived."""

    request_id: str
    num_samples: int
    arrival_s: float


T = TypeVar("T", bound=Entry)


@dataclass(slots=True)
class BatchScheduler(Generic[T]):
    max_batch_size: int
    batch_window_s: float
    max_queue_size: int
    waiting: deque[T] = field(default_factory=deque)
    running: list[T] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be at least 1, got {self.max_batch_size}")
        if self.batch_window_s < 0:
            raise ValueError(f"batch_window_s: must not be negative, got {self.batch_window_s}")

    @property
    def num_running_samples(self) -> int:
        return sum(entry.num_samples for entry in self.running)

    @property
    def num_free_slots(self) -> int:
        return self.max_batch_size - self.num_running_samples

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def add(self, entry: T) -> None:
        """Queues `entry`; raises Overloaded when the queue is full."""
        assert entry.num_samples <= self.max_batch_size
        if len(self.waiting) >= self.max_queue_size:
            raise Overloaded(f"diffusion queue is full ({self.max_queue_size} requests waiting)")
        self.waiting.append(entry)

    def admit(self, now_s: float) -> list[T]:
        """Moves the requests that may start now from the queue to the running set, oldest first."""
        if not self.waiting or self.seconds_until_admission(now_s) > 0:
            return []
        admitted = []
        while self.waiting and self.waiting[0].num_samples <= self.num_free_slots:
            entry = self.waiting.popleft()
            self.running.append(entry)
            admitted.append(entry)
        return admitted

    def seconds_until_admission(self, now_s: float) -> float:
        """0 when the head of the queue may start now; the rest of the batching window otherwise."""
        if self.running:
            return 0.0
        if sum(entry.num_samples for entry in self.waiting) >= self.max_batch_size:
            return 0.0
        return max(0.0, self.waiting[0].arrival_s + self.batch_window_s - now_s)

    def remove(self, entry: T) -> None:
        """Drops `entry` from wherever it is (finished, cancelled or failed); its slots free up at once."""
        # By identity: two requests may carry equal fields.
        self.running = [e for e in self.running if e is not entry]
        self.waiting = deque(e for e in self.waiting if e is not entry)

"""Admission control: per-backend in-flight limits with a bounded FIFO wait queue.

A request takes a slot of each backend it needs for as long as it runs. When all slots are
busy it waits in a queue of at most `max_queued` requests for at most `queue_timeout_s`;
beyond either bound it is refused with `Overloaded` (→ 429 / RESOURCE_EXHAUSTED). Memory is
bounded by `max_in_flight + max_queued` requests per backend.

`FOLLOW_LIMIT` as `max_queued` (the default) queues as many as the limit, so clients that keep at most the
limit in flight never find the queue full. They do find every slot taken at times: a client sends its next
request as soon as it has the last answer, which can reach it before that request's slot is given back. With no
queue, 12 of 100 such gRPC requests at the limit were refused on the CPU box. With a fixed queue of 64 per worker
(the default before), one request in 768 got a 429 at 256 streams on an H100, where streams that start together end
together.

Slots are handed directly to the oldest waiter on release (FIFO, no barging). A waiter that is
cancelled or times out leaves the queue; if a slot was handed to it in the same instant, it
passes the slot on, so no slot ever leaks.

A limit may change while requests run (`resize`: one derived from the backends' load reports,
`chorus.gateway.capacity`): a higher one admits waiters at once; under a lower one the requests
running finish, and a released slot goes to a waiter only once fewer than the limit are running.

The worker processes of one gateway share their limits (`host`, `chorus.gateway.host_slots`): the limit
bounds the slots all of them hold, so a slot another worker gives back is one this worker's waiters
may take; they look for one every `HOST_POLL_S` while they wait.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator

from chorus.gateway.host_slots import HostSlots
from chorus.gateway.metrics import IN_FLIGHT, MAX_IN_FLIGHT, QUEUE_DEPTH
from chorus.runtime.errors import Overloaded

_HOLD_SMOOTHING = 0.2  # weight of the newest slot hold time in the moving average
HOST_POLL_S = 0.005  # how often waiters look for a slot another worker of the host gave back
FOLLOW_LIMIT = -1  # `max_queued`: as many as `max_in_flight`, whatever it is now


class BackendAdmission:
    def __init__(
        self, backend: str, max_in_flight: int, max_queued: int, queue_timeout_s: float, host: HostSlots | None = None
    ) -> None:
        """`host`: the counts of every worker of this gateway, which `max_in_flight` then bounds together."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight: must be at least 1, got {max_in_flight}")
        if max_queued < 0 and max_queued != FOLLOW_LIMIT:
            raise ValueError(f"max_queued: must not be negative (but {FOLLOW_LIMIT}: the limit), got {max_queued}")
        self.backend = backend
        self.max_in_flight = max_in_flight
        self._max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self._num_in_flight = 0
        self.host = host
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._host_poll: asyncio.Task | None = None
        self._mean_hold_s = 1.0
        MAX_IN_FLIGHT.labels(backend).set(max_in_flight)

    @property
    def max_queued(self) -> int:
        return self.max_in_flight if self._max_queued == FOLLOW_LIMIT else self._max_queued

    @property
    def num_in_flight(self) -> int:
        return self._num_in_flight

    @property
    def queue_depth(self) -> int:
        return len(self._waiters)

    def retry_after_s(self) -> float:
        """A guess at when a slot frees up: the queue ahead, drained at the observed hold time."""
        return max(1.0, self._mean_hold_s * (self.queue_depth + 1) / self.max_in_flight)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        started = time.monotonic()
        try:
            yield
        finally:
            held_s = time.monotonic() - started
            self._mean_hold_s += _HOLD_SMOOTHING * (held_s - self._mean_hold_s)
            self.release()

    async def acquire(self) -> None:
        if not self._waiters and self._take():
            self._report()
            return
        if len(self._waiters) >= self.max_queued:
            raise Overloaded(f"{self.backend} is at capacity; retry later", self.retry_after_s())
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self.host is not None and self._host_poll is None:
            self._host_poll = asyncio.create_task(self._poll_host())
        self._report()
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived as we gave up: hand it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                self._report()
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    f"{self.backend}: no slot within the {self.queue_timeout_s:g} s queue timeout; retry later",
                    self.retry_after_s(),
                ) from None
            raise

    def resize(self, max_in_flight: int) -> None:
        """A new limit: waiters take the slots a higher one opens, now; a lower one takes effect as slots free."""
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight: must be at least 1, got {max_in_flight}")
        self.max_in_flight = max_in_flight
        MAX_IN_FLIGHT.labels(self.backend).set(max_in_flight)
        self._admit_waiters()
        self._report()

    def release(self) -> None:
        if self._held() <= self.max_in_flight and self._hand_to_waiter():
            return  # the slot moved to the waiter: in-flight count unchanged
        assert self._num_in_flight > 0, "release without acquire"
        self._num_in_flight -= 1
        if self.host is not None:
            self.host.give_back(self.backend)
        self._report()

    def _take(self) -> bool:
        """A slot for this process if the limit leaves one (counting every worker's with `host`)."""
        if self.host is None:
            is_free = self._num_in_flight < self.max_in_flight
        else:
            is_free = self.host.try_take(self.backend, self.max_in_flight)
        self._num_in_flight += is_free
        return is_free

    def _held(self) -> int:
        """The slots the limit bounds: this process's, or with `host` every worker's."""
        return self._num_in_flight if self.host is None else self.host.total(self.backend)

    def _admit_waiters(self) -> None:
        """Slots the limit leaves, to the waiters, oldest first."""
        while self._has_waiter() and self._take():
            self._hand_to_waiter()

    def _has_waiter(self) -> bool:
        while self._waiters and self._waiters[0].done():  # given up (cancelled, timed out)
            self._waiters.popleft()
        return bool(self._waiters)

    async def _poll_host(self) -> None:
        """While anyone waits here: takes the slots other workers of the host give back."""
        try:
            while self._has_waiter():
                await asyncio.sleep(HOST_POLL_S)
                self._admit_waiters()  # each hand-off reports the gauges
        finally:
            self._host_poll = None

    def _hand_to_waiter(self) -> bool:
        """Gives a slot to the oldest waiter still waiting; False when there is none."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._report()
                return True
        return False

    def _report(self) -> None:
        IN_FLIGHT.labels(self.backend).set(self._num_in_flight)
        QUEUE_DEPTH.labels(self.backend).set(len(self._waiters))


class Admission:
    """One `BackendAdmission` per backend kind; a request enters every backend it needs, in a fixed order."""

    def __init__(self, backends: dict[str, BackendAdmission]) -> None:
        self.backends = backends

    @contextlib.asynccontextmanager
    async def enter(self, *kinds: str) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            # A fixed order (sorted) keeps two requests that need the same backends from deadlocking.
            for kind in sorted(kinds):
                await stack.enter_async_context(self.backends[kind].slot())
            yield

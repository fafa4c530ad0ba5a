"""Mid-stream fail-over: which backend failures a stream survives, and noticing a replica that hangs.

A replica that dies (connection reset: UNAVAILABLE), breaks a stream off without its Final, or ends it
on its own (a Final saying cancelled or unavailable, e.g. while draining) is replaced by another healthy
replica of the same backend, up to `max_failovers` times per stream; the caller sends the new replica
what it needs to continue exactly where the old one stopped. A replica that goes silent (SIGSTOP, a
stuck GPU) is noticed by probing its health once a stream has waited `stall_s` for its next message:
a replica that is only slow answers the probe and keeps the stream; a hung one does not and is
replaced. Bad requests and full queues are not retried: another replica would answer the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol, TypeVar

import grpc
from prometheus_client import Counter

from chorus.runtime.errors import Unavailable
from chorus.runtime.tasks import cancel_and_wait
from chorus.v1 import common_pb2

log = logging.getLogger("chorus.gateway.failover")
Message = TypeVar("Message")

FAILOVERS = Counter(
    "chorus_gateway_failovers", "Streams moved to another backend replica mid-stream, by backend.", ["backend"]
)

# Codes a broken replica (not a bad request) produces. DEADLINE_EXCEEDED is the request's own deadline: not retried.
_RETRYABLE_CODES = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DATA_LOSS,
}
_RETRYABLE_FINAL_CODES = {code.name for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)}
STATUS_WAIT_S = 1.0  # after its Final, how long a replica may take to end the call before the caller cancels it


@dataclasses.dataclass(frozen=True)
class FailoverPolicy:
    max_failovers: int = 3  # per stream and backend
    stall_s: float = 2.0  # waiting this long for a replica's next message triggers a health probe
    probe_timeout_s: float = 2.0  # a probe not answered in this time counts as a hung replica
    replica_wait_s: float = 5.0  # how long a fail-over waits for a healthy replica (e.g. one restarting)


DEFAULT_POLICY = FailoverPolicy()


class ReplicaFailed(Unavailable):
    """The replica serving a stream broke; the stream may continue on another one."""


class Replica(Protocol):
    target: str
    stub: object

    async def probe(self, timeout_s: float) -> bool: ...


class ReplicaSource(Protocol):
    """Where streams get their replicas: the gateway's `BackendPool`, or fixed stubs in tests."""

    async def acquire(self, kind: str, wait_s: float) -> Replica:
        """A healthy replica of `kind` (counted busy until `release`); waits up to `wait_s` for one."""
        ...

    def release(self, replica: Replica) -> None: ...

    def failed(self, replica: Replica) -> None:
        """`replica` broke a stream: route no new work to it until its health check passes again."""
        ...


def failure_of(exc: grpc.aio.AioRpcError, backend: str) -> ReplicaFailed | None:
    """The retryable failure an RPC error means, or None when another replica would fail the same way."""
    if exc.code() not in _RETRYABLE_CODES:
        return None
    return ReplicaFailed(f"{backend} failed: {exc.code().name}: {exc.details()}")


def check_final_for_failover(final: common_pb2.Final, backend: str) -> None:
    """Raises ReplicaFailed for a Final that ends a stream the client did not end (a replica draining or
    failing internally); other error Finals are the caller's to judge."""
    if final.reason == common_pb2.FINISH_REASON_CANCELLED:
        raise ReplicaFailed(f"{backend} cancelled the stream")
    if final.reason == common_pb2.FINISH_REASON_ERROR and final.error.code in _RETRYABLE_FINAL_CODES:
        raise ReplicaFailed(f"{backend} failed: {final.error.message or final.error.code}")


async def next_message(
    messages: AsyncIterator[Message],
    replica: Replica,
    policy: FailoverPolicy,
    is_owed: Callable[[], bool] = lambda: True,
    watched: asyncio.Task | None = None,
) -> Message | None:
    """The next message of a replica's stream (None at its end); raises ReplicaFailed once the replica has
    kept it waiting `stall_s` while `is_owed()` (it has work to answer) and then fails a health probe. A
    `watched` task that fails meanwhile (the stream's writer) raises its error instead. The read it started has
    ended when it returns or raises."""
    if watched is not None and watched.done() and watched.exception() is not None:
        raise watched.exception()
    pending = asyncio.ensure_future(anext(messages, None))
    waiting = {pending} if watched is None or watched.done() else {pending, watched}
    try:
        while True:
            done, _ = await asyncio.wait(waiting, timeout=policy.stall_s, return_when=asyncio.FIRST_COMPLETED)
            if pending in done:
                return pending.result()
            if watched in done:
                if watched.exception() is not None:
                    raise watched.exception()
                waiting = {pending}  # it finished its work: only the stream is left to wait for
                continue
            if is_owed() and not await replica.probe(policy.probe_timeout_s):
                raise ReplicaFailed(f"replica {replica.target} stopped answering (no output for {policy.stall_s:g} s)")
    finally:
        # The read ends with the wait: one left behind would still be reading the stream while a fail-over moves
        # it to another replica, or after the caller closed it.
        if not pending.done():
            # Its own error is dropped: what ended the wait (a failure, a cancel) is raised already.
            await cancel_and_wait([pending], f"read of {replica.target}")


async def await_status(call, wait_s: float = STATUS_WAIT_S) -> None:
    """Once a replica's Final has come, lets its call end on the replica's own status (OK) rather than on the
    caller's cancel: a cancel races that status, and the replica then counts a stream that succeeded as cancelled
    by its client (and gRPC logs its failed status send as an error). A replica slow to end the call is left to
    the caller's cancel after `wait_s`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(call.code(), wait_s)


class Failovers:
    """Counts one stream's fail-overs on one backend and says when to give up."""

    def __init__(self, backend: str, request_id: str, source: ReplicaSource, policy: FailoverPolicy) -> None:
        self.backend = backend
        self.request_id = request_id
        self.source = source
        self.policy = policy
        self.count = 0

    def record(self, replica: Replica, error: ReplicaFailed) -> None:
        """Takes `replica` out of rotation; re-raises `error` once the stream used up its fail-overs."""
        self.source.failed(replica)
        if self.count >= self.policy.max_failovers:
            raise Unavailable(f"{error} (after {self.count} fail-overs)") from None
        self.count += 1
        FAILOVERS.labels(self.backend).inc()
        log.warning(
            "request %s: %s replica %s failed (%s); continuing on another replica",
            self.request_id,
            self.backend,
            replica.target,
            error,
        )

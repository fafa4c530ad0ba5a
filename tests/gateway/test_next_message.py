"""Waiting for a replica's next message (`next_message`): the read it started ends before it returns."""

from __future__ import annotations

import asyncio

import pytest

from chorus.gateway.failover import FailoverPolicy, ReplicaFailed, next_message


class HungReplica:
    """A replica that stopped answering: its health probe fails."""

    target = "hung"
    stub = None

    async def probe(self, timeout_s: float) -> bool:
        return False


async def test_the_read_of_a_hung_replica_ends_before_its_failure_is_raised():
    read_ended = asyncio.Event()

    async def silent_stream():
        try:
            await asyncio.Event().wait()  # the replica never answers
        finally:
            await asyncio.sleep(0.1)  # closing a stream takes a moment (a gRPC call's own cleanup)
            read_ended.set()
        yield "never"

    policy = FailoverPolicy(stall_s=0.05, probe_timeout_s=0.05)
    async with asyncio.timeout(5):
        with pytest.raises(ReplicaFailed):
            await next_message(silent_stream(), HungReplica(), policy)
    assert read_ended.is_set(), "before the fix the read was cancelled, not awaited: it outlived the call"

"""Runs as units of work in Redis: a stream with one consumer group, every gateway process a consumer.

Admitting a request creates its record and adds its run (what is needed to run it again: the spec) to
the stream and, in the same script, delivers it to the admitting process itself: the entry is in that
process's pending list at once, so the happy path gains no round trip and no hop. An owner keeps its runs' entries fresh
(`heartbeat`, which also tells it which runs it no longer owns). An entry left idle longer than the lease
— its owner died or hangs — is taken by another process with XAUTOCLAIM (`reclaim`), which continues the
run from its journal. A process handing its runs over (SIGTERM) marks their entries idle (`release`) so
the next XAUTOCLAIM anywhere takes them. A finished run's entry is acknowledged and deleted (`done`).

Pending-list ownership decides who runs a request; the request record's `runner` field fences what a
runner writes (`fence` scripts in `journal` and `requests`): a process that lost a run while stopped
cannot write into it when it wakes up.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import uuid

import redis.asyncio as redis

from chorus.gateway.state import keys
from chorus.gateway.state.connection import redis_guard

log = logging.getLogger("chorus.gateway.runs")
GROUP = "gateways"
RELEASED = "released"  # the consumer holding entries handed over: no process's, so no heartbeat renews them

# KEYS[1] runs stream, KEYS[2] request record, KEYS[3] idempotency key. ARGV: group, consumer, request id, spec,
# record TTL, idempotency TTL (0: no key), then the record's field/value pairs. All or nothing: claims the key
# (or returns {0, the request that has it}), creates the record, adds the run and delivers it to `consumer`
# (every add is delivered in the same script, so `>` holds nothing older); returns {1, entry id}. A stream Redis
# lost (a restart without persistence) is NOGROUP before any write: a script's writes stay when it fails.
_ADMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NOGROUP the runs stream is gone (Redis lost its data)')
end
if ARGV[6] ~= '0' then
  local existing = redis.call('GET', KEYS[3])
  if existing then return {0, existing} end
  redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[6])
end
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', KEYS[2], ARGV[5])
local id = redis.call('XADD', KEYS[1], '*', 'request_id', ARGV[3], 'spec', ARGV[4])
local delivered = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
assert(delivered[1][2][1][1] == id, 'runs stream: an undelivered entry was ahead of the new one')
return {1, id}
"""

# KEYS[1] runs stream. ARGV: group, consumer. Resets the idle time of every entry `consumer` still owns and
# returns their ids; entries another process took are not among them.
_HEARTBEAT = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 100000, ARGV[2])
local ids = {}
for _, entry in ipairs(pending) do ids[#ids + 1] = entry[1] end
for i = 1, #ids, 500 do
  local args = {KEYS[1], ARGV[1], ARGV[2], 0}
  for j = i, math.min(i + 499, #ids) do args[#args + 1] = ids[j] end
  args[#args + 1] = 'JUSTID'
  redis.call('XCLAIM', unpack(args))
end
return ids
"""


def consumer_name() -> str:
    """This process as a consumer: readable in XINFO and logs, unique even across restarts with the same pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass(frozen=True, slots=True)
class RunEntry:
    entry_id: str
    request_id: str
    spec: bytes  # what the run needs to start again anywhere (`chorus.gateway.run_spec`)


class RunQueue:
    def __init__(self, client: redis.Redis, consumer: str, lease_s: float, stream: str = keys.RUNS) -> None:
        self.client = client
        self.stream = stream
        self.consumer = consumer
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self._admit = client.register_script(_ADMIT)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._has_group = False
        self._cursor = "0-0"

    async def ensure_group(self) -> None:
        """Creates the stream and its group if missing (first process, or a Redis that lost its data)."""
        if self._has_group:
            return
        with redis_guard("creating the run queue"):
            try:
                await self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._has_group = True

    async def _call(self, what: str, command):
        """Runs `command()`, recreating the group once if Redis lost it (NOGROUP) meanwhile."""
        await self.ensure_group()
        with redis_guard(what):
            try:
                return await command()
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._has_group = False
        await self.ensure_group()
        with redis_guard(what):
            return await command()

    async def admit(
        self, fields: dict[str, str], spec: bytes, record_ttl_s: int, idempotency: tuple[str, int] | None
    ) -> tuple[bool, str]:
        """Creates a request's record and its run, owned by this process, in one step (a process dying between
        the two would leave a request nobody runs); with `idempotency` (key, TTL), only if the key is new.
        Returns (True, entry id), or (False, the id of the request the key was used for)."""
        request_id = fields["request_id"]
        idempotency_key, idempotency_ttl_s = idempotency or ("", 0)
        pairs = [value for item in fields.items() for value in item]

        async def command():
            args = [GROUP, self.consumer, request_id, spec, record_ttl_s, idempotency_ttl_s, *pairs]
            return await self._admit(keys=[self.stream, keys.record(request_id), idempotency_key], args=args)

        is_new, value = await self._call("creating a request", command)
        return bool(is_new), value.decode()

    async def heartbeat(self) -> set[str]:
        """Keeps this process's entries fresh; returns the ids it still owns."""

        async def command():
            return await self._heartbeat(keys=[self.stream], args=[GROUP, self.consumer])

        return {entry_id.decode() for entry_id in await self._call("renewing run leases", command)}

    async def reclaim(self, count: int = 16) -> list[RunEntry]:
        """Entries idle past the lease (their owner died, hangs or handed them over), now this process's."""

        async def command():
            return await self.client.xautoclaim(
                self.stream, GROUP, self.consumer, self.lease_ms, start_id=self._cursor, count=count
            )

        reply = await self._call("reclaiming runs", command)
        self._cursor = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        entries = []
        for entry_id, fields in reply[1]:
            if fields is None:  # deleted meanwhile
                continue
            entries.append(RunEntry(entry_id.decode(), fields[b"request_id"].decode(), fields[b"spec"]))
        return entries

    async def release(self, entry_ids: list[str]) -> None:
        """Hands entries over: marks them idle past any lease and owned by no process (this one's heartbeat would
        renew them), so the next reclaim by any process, this one's included, takes them."""
        if not entry_ids:
            return

        async def command():
            idle_ms = 1000 * self.lease_ms
            return await self.client.xclaim(self.stream, GROUP, RELEASED, 0, entry_ids, idle=idle_ms, justid=True)

        await self._call("handing runs over", command)

    async def done(self, entry_id: str) -> None:
        """The run ended (its end marker is journaled): nobody needs to run it again."""

        async def command():
            async with self.client.pipeline(transaction=False) as pipe:
                return await pipe.xack(self.stream, GROUP, entry_id).xdel(self.stream, entry_id).execute()

        await self._call("finishing a run", command)

"""The output journal: every chunk a request sends, kept in a capped Redis stream for resume.

Chunk `sequence` n is stored under the stream id `0-(n+1)`, so "everything after sequence n"
is a plain `XREAD` after id `0-(n+1)`. The last entry is the end marker with the final status.
A reader replays what is journaled, then follows live entries (`XREAD BLOCK`) until the end
marker, so a client that reconnects gets exactly the bytes it missed, in order.

The stream's TTL is set with its first chunk and again with the end marker, not per chunk: like
the request record (whose TTL moves only on status transitions), it outlives the run by `ttl_s`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator

import redis.asyncio as redis

from chorus.gateway.state import keys
from chorus.gateway.state.connection import redis_guard
from chorus.gateway.state.requests import DONE, FAILED, TERMINAL, RequestRecord, RequestStore, RunLost
from chorus.runtime.errors import NotFound

_END_SEQUENCE = 2**63 - 2  # id of the end marker: after every chunk

# KEYS[1] record, KEYS[2] journal. ARGV: runner ("" = any), stream id, max entries, data, ttl_s (0: keep the
# TTL). Appends unless another runner owns the request now; returns 1 if appended.
_FENCED_APPEND = """
if ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'runner') ~= ARGV[1] then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[3], ARGV[2], 'data', ARGV[4])
if ARGV[5] ~= '0' then redis.call('EXPIRE', KEYS[2], ARGV[5]) end
return 1
"""


@dataclasses.dataclass(frozen=True, slots=True)
class JournalEntry:
    sequence: int
    data: bytes
    final: dict | None = None  # set on the end marker: {"status": ..., "error": ..., "usage": ...}


@dataclasses.dataclass(frozen=True, slots=True)
class JournalPosition:
    """How much output a run taken over finds journaled."""

    num_chunks: int
    num_bytes: int


class JournalTrimmed(NotFound):
    """The chunks a client asked for were trimmed from the capped journal; it cannot resume."""


def _stream_id(sequence: int) -> str:
    return f"0-{sequence + 1}"


def _entry(stream_id: bytes, fields: dict[bytes, bytes]) -> JournalEntry:
    sequence = int(stream_id.split(b"-")[1]) - 1
    if b"final" in fields:
        return JournalEntry(sequence, b"", final=json.loads(fields[b"final"]))
    return JournalEntry(sequence, fields[b"data"])


def _final_of(record: RequestRecord, last_read: int) -> dict:
    """The end marker a run that ended without writing one would have written. A run done is one only if its
    last chunk is the last one read: a stream must not end "done" short of its audio."""
    if record.status == DONE and record.last_sequence != last_read:
        message = f"the stream reached chunk {last_read}, but the run recorded chunk {record.last_sequence} as its last"
        return {"status": FAILED, "error": {"code": "DATA_LOSS", "message": message}, "usage": None}
    return {"status": record.status, "error": record.error, "usage": record.usage}


class OutputJournal:
    def __init__(
        self, client: redis.Redis, requests: RequestStore, max_entries: int = 10_000, block_ms: int = 1000
    ) -> None:
        self.client = client
        self.requests = requests
        self.max_entries = max_entries
        self.block_ms = block_ms
        self._append = client.register_script(_FENCED_APPEND)

    async def append(self, request_id: str, sequence: int, data: bytes, runner: str = "") -> None:
        """Journals chunk `sequence`; with `runner`, only while that runner owns the request (else `RunLost`).
        The stream's TTL is set with the first chunk."""
        ttl_s = self.requests.ttl_s if sequence == 0 else 0
        args = [runner, _stream_id(sequence), self.max_entries, data, ttl_s]
        with redis_guard("journaling output"):
            appended = await self._append(keys=[keys.record(request_id), keys.journal(request_id)], args=args)
        if not appended:
            raise RunLost(f"request {request_id!r} is run by another gateway process now")

    async def position(self, request_id: str) -> JournalPosition:
        """(chunks, bytes) journaled so far: where a run taken over continues its output."""
        with redis_guard("reading the output journal"):
            entries = await self.client.xrange(keys.journal(request_id))
        chunks = [_entry(stream_id, fields) for stream_id, fields in entries if b"data" in fields]
        if chunks and chunks[0].sequence != 0:
            raise JournalTrimmed(f"request {request_id!r}: its journal was trimmed; it cannot be continued")
        return JournalPosition(len(chunks), sum(len(chunk.data) for chunk in chunks))

    async def finish(
        self, request_id: str, status: str, error: dict | None = None, usage: dict | None = None
    ) -> JournalEntry:
        """Writes the end marker, after which readers stop; returns it as a reader gets it."""
        final = json.dumps({"status": status, "error": error, "usage": usage})
        key = keys.journal(request_id)
        with redis_guard("journaling output"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.xadd(key, {"final": final}, id=_stream_id(_END_SEQUENCE))
                pipe.expire(key, self.requests.ttl_s)
                await pipe.execute()
        return JournalEntry(_END_SEQUENCE, b"", final=json.loads(final))

    async def read(self, request_id: str, after_sequence: int | None = None) -> AsyncIterator[JournalEntry]:
        """Journaled chunks after `after_sequence` (None: from the start), then live ones, then the end marker."""
        key = keys.journal(request_id)
        last_id = _stream_id(after_sequence) if after_sequence is not None else "0-0"
        expected_sequence = 0 if after_sequence is None else after_sequence + 1
        while True:
            with redis_guard("reading the output journal"):
                reply = await self.client.xread({key: last_id}, count=64, block=self.block_ms)
            if not reply:
                # Nothing new within block_ms: the request may have ended without its end marker (its process
                # died between the record's last write and the marker's, or it was cancelled while queued); its
                # record then says how it ended. Raises NotFound if the record itself expired.
                record = await self.requests.get(request_id)
                if record.status in TERMINAL and not await self._has_entries_after(key, last_id):
                    yield JournalEntry(_END_SEQUENCE, b"", final=_final_of(record, expected_sequence - 1))
                    return
                continue
            for stream_id, fields in reply[0][1]:
                entry = _entry(stream_id, fields)
                if entry.final is None and entry.sequence != expected_sequence:
                    raise JournalTrimmed(
                        f"request {request_id!r}: sequence {expected_sequence} is no longer journaled; cannot resume"
                    )
                yield entry
                if entry.final is not None:
                    return
                expected_sequence += 1
                last_id = stream_id

    async def _has_entries_after(self, key: str, last_id: str) -> bool:
        with redis_guard("reading the output journal"):
            return bool(await self.client.xread({key: last_id}, count=1))

"""A run's output handed in memory to the readers on its own replica, the journal behind it.

The run journals each entry first and then publishes it here, so a reader on the same replica
(the common case: the client that started the request) takes live entries without a Redis
round trip per chunk. The journal stays the record: a reader that starts behind the live point
(attached late, resumed after a sequence) replays it first, already subscribed so that nothing
published meanwhile is missed, and entries seen both ways are told apart by sequence. A reader
that falls more than `max_buffered_bytes` behind is dropped back to the journal the same way, so
memory stays bounded even for a reader the run's `OutputLead` does not wait for. A run that ends
without publishing its end marker (Redis failed) leaves its readers to the journal, which then
behaves for them exactly as for a reader on another replica.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Iterator

from chorus.gateway.state.journal import JournalEntry, OutputJournal


class _Subscriber:
    def __init__(self) -> None:
        self.entries: collections.deque[JournalEntry] = collections.deque()
        self.num_bytes = 0
        self.is_dropped = False  # fell too far behind: catches up from the journal
        self.changed = asyncio.Event()


class LiveOutput:
    def __init__(self, journal: OutputJournal, request_id: str, max_buffered_bytes: int = 4 << 20) -> None:
        self.journal = journal
        self.request_id = request_id
        self.max_buffered_bytes = max_buffered_bytes
        self.num_published = 0  # chunks published so far: the next one's sequence
        self.is_closed = False
        self._subscribers: set[_Subscriber] = set()

    def publish(self, entry: JournalEntry) -> None:
        """Hands a journaled entry (a chunk, in sequence order, or the end marker) to every reader."""
        if entry.final is None:
            assert entry.sequence == self.num_published, "chunks are published in order"
            self.num_published += 1
        for subscriber in self._subscribers:
            if subscriber.is_dropped:
                continue
            subscriber.entries.append(entry)
            subscriber.num_bytes += len(entry.data)
            if subscriber.num_bytes > self.max_buffered_bytes:
                subscriber.is_dropped = True
                subscriber.entries.clear()
            subscriber.changed.set()

    def close(self) -> None:
        """The run is over; readers still waiting get the rest (if any) from the journal."""
        self.is_closed = True
        for subscriber in self._subscribers:
            subscriber.changed.set()

    @contextlib.contextmanager
    def _subscribed(self) -> Iterator[_Subscriber]:
        subscriber = _Subscriber()
        self._subscribers.add(subscriber)
        try:
            yield subscriber
        finally:
            self._subscribers.discard(subscriber)

    async def read(self, after_sequence: int | None = None) -> AsyncIterator[JournalEntry]:
        """What `OutputJournal.read` would yield from `after_sequence` on, live entries from memory."""
        next_sequence = 0 if after_sequence is None else after_sequence + 1
        while True:
            with self._subscribed() as subscriber:
                if next_sequence < self.num_published:  # behind the live point: replay the journal
                    async with contextlib.aclosing(self._journal_after(next_sequence)) as replay:
                        async for entry in replay:
                            yield entry
                            if entry.final is not None:
                                return
                            next_sequence += 1
                            if next_sequence >= self.num_published:
                                break
                while True:
                    while not subscriber.entries and not subscriber.is_dropped and not self.is_closed:
                        subscriber.changed.clear()
                        await subscriber.changed.wait()
                    if not subscriber.entries:
                        break
                    entry = subscriber.entries.popleft()
                    subscriber.num_bytes -= len(entry.data)
                    if entry.final is None and entry.sequence < next_sequence:
                        continue  # replayed from the journal already
                    yield entry
                    if entry.final is not None:
                        return
                    next_sequence += 1
            if self.is_closed and not subscriber.is_dropped:
                break
        async for entry in self._journal_after(next_sequence):
            yield entry

    def _journal_after(self, next_sequence: int) -> AsyncIterator[JournalEntry]:
        return self.journal.read(self.request_id, next_sequence - 1 if next_sequence > 0 else None)

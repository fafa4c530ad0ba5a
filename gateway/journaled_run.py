"""The lifecycle every request run shares: record transitions, cancel watch, journal end marker.

A subclass produces the output (`_produce`, journaling chunks with `_journal`) and returns the
usage; this base moves the record queued → running → done | failed | cancelled, stops the
production when a cancel is requested on any replica (the record's flag, woken early by
pub/sub), and always writes the journal's end marker so readers stop. Every journaled entry is
then published to the run's `LiveOutput`, for readers on this replica.

A run belongs to one gateway process at a time (`runner`: the record field that fences its writes).
A run taken over from another process (`resume`) produces its output again from the start and
journals only the bytes past what the journal already holds, so readers get one continuous stream;
a run handed over (`hand_over`) or lost to another process (`RunLost`) stops without writing an end.

A subclass may `mark` the stages of its production; they are stored on the record with its end
(`RequestRecord.timeline_ms` puts them between admission, start and end), one write for them all.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from chorus.gateway.live_output import LiveOutput
from chorus.gateway.output_lead import OutputLead
from chorus.gateway.state.cancel import CancelListener, CancelWatch
from chorus.gateway.state.journal import JournalEntry, JournalPosition, OutputJournal
from chorus.gateway.state.requests import CANCELLED, DONE, FAILED, RUNNING, RequestStore, RunLost
from chorus.runtime.errors import ChorusError, status_for
from chorus.runtime.tasks import cancel_and_join, cancel_and_wait

log = logging.getLogger("chorus.gateway.run")
_CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
HANDED_OVER = "handed-over"  # `run`'s result when another process continues the run


class JournaledRun:
    lead: OutputLead | None = None  # runs whose output waits for its readers set one

    def __init__(
        self,
        requests: RequestStore,
        journal: OutputJournal,
        cancels: CancelListener,
        request_id: str,
        runner: str = "",
        resume: JournalPosition | None = None,
    ) -> None:
        self.requests = requests
        self.journal = journal
        self.cancels = cancels
        self.request_id = request_id
        self.runner = runner
        self.resume = resume
        self.output = LiveOutput(journal, request_id)
        if resume is not None:
            self.output.num_published = resume.num_chunks  # those are in the journal, for readers to replay
        self.entry_id: str | None = None  # its entry in the run queue, once queued
        self._bytes_to_skip = resume.num_bytes if resume else 0
        self._is_handed_over = False
        self.timeline: dict[str, float] = {}  # stage → wall-clock time (time.time(), as the record's stamps)

    def mark(self, stage: str, at_s: float | None = None) -> None:
        """Notes that the run reached `stage` now, or at `at_s` (time.time()); again: the later time counts, e.g.
        after a fail-over."""
        self.timeline.pop(stage, None)  # keeps the stages in the order they were last reached
        self.timeline[stage] = time.time() if at_s is None else at_s

    async def _produce(self) -> dict:
        """Journals the output; returns the usage (with `last_sequence`). Raises ChorusError on failure."""
        raise NotImplementedError

    def hand_over(self, task: asyncio.Task) -> None:
        """Stops this process's production of the run (its `task`) without ending it: another continues it."""
        self._is_handed_over = True
        task.cancel()

    async def run(self) -> str:
        """Runs to the end; returns the final status (or HANDED_OVER). Never raises for a failed request."""
        try:
            with self.cancels.watch(self.request_id) as cancel:
                # A run taken over may find its request still queued (its first process died before it began).
                is_started = await self.requests.transition(self.request_id, RUNNING, runner=self.runner)
                if not is_started and self.resume is None:
                    return (await self.requests.get(self.request_id)).status  # cancelled before it started
                return await self._run_watched(cancel)
        except RunLost:
            log.warning("request %s: another gateway process runs it now; stopped here", self.request_id)
            return HANDED_OVER
        finally:
            self.output.close()

    async def _run_watched(self, cancel: CancelWatch) -> str:
        cancel_watch = asyncio.create_task(cancel.wait())
        produce = asyncio.create_task(self._produce())
        try:
            await asyncio.wait({cancel_watch, produce}, return_when=asyncio.FIRST_COMPLETED)
            if cancel_watch.done() and cancel_watch.exception() is not None:
                # Redis failed while watching: the run's own journal writes will surface it.
                await asyncio.wait({produce})
            if not produce.done():  # a cancel was requested
                await cancel_and_join(produce, f"request {self.request_id}")
                return await self._end(CANCELLED, None, None)
            try:
                usage = produce.result()
            except RunLost:
                raise
            except ChorusError as exc:
                code, message = status_for(exc)
                # The client's own mistakes are its to read; a backend's failure is the operator's too.
                level = logging.INFO if code in _CLIENT_CODES else logging.WARNING
                # The cause (e.g. which Redis error) is the operator's to read, not the client's.
                cause = f" (cause: {exc.__cause__!r})" if exc.__cause__ is not None else ""
                log.log(level, "request %s failed: %s: %s%s", self.request_id, code.name, message, cause)
                return await self._end(FAILED, {"code": code.name, "message": message}, None)
            except Exception:
                log.exception("request %s failed", self.request_id)
                return await self._end(FAILED, {"code": "INTERNAL", "message": "internal error"}, None)
            return await self._end(DONE, None, usage)
        except asyncio.CancelledError:
            produce.cancel()
            if self._is_handed_over:
                return HANDED_OVER
            # detached: no reader came back in time
            await self._end(CANCELLED, {"code": "CANCELLED", "message": "the client went away"}, None)
            raise
        finally:
            # Both end with the run: a cancel watch left behind polls Redis for a request long over (forever if a
            # Redis command lost its cancel), and a production left behind could journal after a hand-over.
            await cancel_and_wait([cancel_watch, produce], f"request {self.request_id}")

    async def _journal(self, sequence: int, data: bytes) -> int:
        """Journals `data` as chunk `sequence` (nothing for empty data); returns the next sequence. A run taken
        over first drops the bytes the journal already holds, and numbers its chunks after them."""
        if self._bytes_to_skip:
            skipped = min(self._bytes_to_skip, len(data))
            self._bytes_to_skip -= skipped
            data = data[skipped:]
        if self.resume is not None:
            sequence = max(sequence, self.resume.num_chunks)
        if not data:
            return sequence
        await self.journal.append(self.request_id, sequence, data, self.runner)
        self.output.publish(JournalEntry(sequence, data))
        return sequence + 1

    async def _end(self, status: str, error: dict | None, usage: dict | None) -> str:
        fields = {"error": error} if error else {}
        if self.timeline:
            fields["timeline"] = self.timeline
        if usage:
            fields |= {"usage": usage, "last_sequence": usage["last_sequence"]}
        try:
            await self.requests.transition(self.request_id, status, runner=self.runner, **fields)
            self.output.publish(await self.journal.finish(self.request_id, status, error=error, usage=usage))
        except RunLost:
            raise
        except ChorusError:  # Redis down: the record's TTL and readers' checks cover it
            pass
        return status

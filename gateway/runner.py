"""The runs of this gateway replica, as tasks of their own, detached from client connections.

Readers (the first response, resumes on any replica) follow the request's output: from memory
when its run lives here (its `LiveOutput`), from the journal otherwise. When the last reader
of a detachable run leaves, the run is cancelled after `detach_grace_s` unless a reader comes
back, which frees the backends' slots promptly while allowing a quick reconnect to resume live.
Asynchronous jobs (202 + request id) are not detachable: they run with no reader at all.
A run may hold an admission slot, released when the run ends however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from chorus.gateway.journaled_run import JournaledRun
from chorus.gateway.state.journal import JournalEntry, OutputJournal
from chorus.runtime.errors import ChorusError
from chorus.runtime.tasks import cancel_and_wait

log = logging.getLogger("chorus.gateway.run")
UNRECORDED = "unrecorded"  # a run's end when Redis failed before it could record it: not over, to be run again


class RunRegistry:
    def __init__(self, journal: OutputJournal, detach_grace_s: float = 0.4) -> None:
        self.journal = journal
        self.detach_grace_s = detach_grace_s
        self._tasks: dict[str, asyncio.Task] = {}
        self._num_readers: dict[str, int] = {}
        self._detach_timers: dict[str, asyncio.TimerHandle] = {}
        self._runs: dict[str, JournaledRun] = {}  # while running: their output and its lead

    def start(
        self, run: JournaledRun, slot: contextlib.AsyncExitStack | None = None, is_detachable: bool = True
    ) -> asyncio.Task:
        """Runs `run` in a task; `slot` (an entered admission) is closed when it ends."""
        task = asyncio.create_task(self._run(run, slot), name=f"run-{run.request_id}")
        self._tasks[run.request_id] = task
        self._runs[run.request_id] = run
        if is_detachable:
            self._num_readers[run.request_id] = 0
        task.add_done_callback(lambda _: self._forget(run.request_id))
        return task

    @staticmethod
    async def _run(run: JournaledRun, slot: contextlib.AsyncExitStack | None) -> str:
        """The run's final status; UNRECORDED when Redis failed before the run could record its start (a later
        failure is recorded as the run's end), which leaves the run to be run again (`RunBroker`)."""
        try:
            return await run.run()
        except ChorusError as exc:
            log.error("request %s: %s (cause: %r); to be run again", run.request_id, exc, exc.__cause__)
            return UNRECORDED
        finally:
            if slot is not None:
                await slot.aclose()

    def is_running(self, request_id: str) -> bool:
        return request_id in self._tasks

    def live_runs(self) -> list[JournaledRun]:
        return list(self._runs.values())

    def hand_over(self, request_id: str) -> None:
        """Stops the run here without ending it (another process continues it); its readers here follow the
        journal from then on."""
        task, run = self._tasks.get(request_id), self._runs.get(request_id)
        if task is not None and run is not None:
            run.hand_over(task)

    async def stopped(self, request_ids) -> None:
        """Waits until the runs handed over stopped (cancelling again one whose cancel a Redis command lost)."""
        tasks = [self._tasks[request_id] for request_id in request_ids if request_id in self._tasks]
        await cancel_and_wait(tasks, "runs handed over")

    @contextlib.contextmanager
    def reading(self, request_id: str):
        """Marks a reader of `request_id` for the duration of the block."""
        if request_id not in self._num_readers:
            yield  # not detachable, or the run lives on another replica (or is over)
            return
        timer = self._detach_timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()
        self._num_readers[request_id] += 1
        try:
            yield
        finally:
            if request_id in self._num_readers:
                self._num_readers[request_id] -= 1
                if self._num_readers[request_id] == 0:
                    loop = asyncio.get_running_loop()
                    self._detach_timers[request_id] = loop.call_later(self.detach_grace_s, self._detach, request_id)

    async def follow(self, request_id: str, after_sequence: int | None = None) -> AsyncIterator[JournalEntry]:
        """The request's output after `after_sequence`, as a reader: keeps the run alive on this replica,
        and lets it run ahead of what was taken only as far as its `OutputLead` allows."""
        run = self._runs.get(request_id)
        entries = self.journal.read(request_id, after_sequence) if run is None else run.output.read(after_sequence)
        with self.reading(request_id):
            async with contextlib.aclosing(entries):
                async for entry in entries:
                    yield entry
                    run = self._runs.get(request_id)
                    if run is not None and run.lead is not None and entry.final is None:
                        run.lead.read(entry.sequence)  # the consumer asked for more: it took this one

    def _detach(self, request_id: str) -> None:
        self._detach_timers.pop(request_id, None)
        task = self._tasks.get(request_id)
        if task is not None and self._num_readers.get(request_id) == 0:
            task.cancel()

    def _forget(self, request_id: str) -> None:
        self._tasks.pop(request_id, None)
        self._num_readers.pop(request_id, None)
        self._runs.pop(request_id, None)
        timer = self._detach_timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()

    async def close(self) -> None:
        await cancel_and_wait(list(self._tasks.values()), "runs")

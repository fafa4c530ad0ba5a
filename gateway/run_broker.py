"""This gateway process's share of the runs: it owns the runs it admitted, keeps them leased, takes over
runs whose owner died, and hands its own over when it stops.

Every run this process starts is queued in Redis as owned by it (`RunQueue.admit`). A loop renews
the leases every `lease_s / 4` and, unless the process is draining, reclaims runs idle past the lease from
any dead or hung process, continuing each from its journal (`continue_run`). A run that could not record its start
(Redis failed) is released on the next tick, so it is run again the same way. A run this process lost (it
was presumed dead while stopped, and another process took it) is stopped here without a trace. On SIGTERM
(`hand_over`) the process stops its runs' production, marks their entries free for the taking, and its
readers follow the runs' journals while other processes continue them. A drain first lets the loop's tick
under way end, claiming and starting nothing more: an XAUTOCLAIM after the release would take the runs back.
A request admitted once the drain began (it waited for its admission slot meanwhile) is handed over unstarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from chorus.gateway.journaled_run import HANDED_OVER, JournaledRun
from chorus.gateway.metrics import RUNS_LOST, RUNS_TAKEN_OVER
from chorus.gateway.runner import UNRECORDED, RunRegistry
from chorus.gateway.state.connection import REDIS_ERRORS
from chorus.gateway.state.runs import RunEntry, RunQueue
from chorus.runtime.errors import ChorusError
from chorus.runtime.tasks import cancel_and_wait, exit_if_it_fails

log = logging.getLogger("chorus.gateway.broker")

ContinueRun = Callable[[RunEntry], Awaitable[JournaledRun | None]]


class RunBroker:
    def __init__(self, queue: RunQueue, runs: RunRegistry) -> None:
        self.queue = queue
        self.runs = runs
        self.is_draining = False
        self._loop: asyncio.Task | None = None
        self._draining = asyncio.Event()  # wakes the loop from its wait between ticks
        self._unrecorded: set[str] = set()  # entries of runs that ended unrecorded: released on the next tick

    @property
    def runner(self) -> str:
        return self.queue.consumer

    async def start_run(
        self, run: JournaledRun, entry_id: str, slot: contextlib.AsyncExitStack | None, is_detachable: bool
    ) -> None:
        """Starts `run`, admitted as this process's (`RunQueue.admit`); its entry is done when it ends here. Once
        the drain began, hands it to the other processes instead: the hand-over may have listed the runs already,
        and nobody here would renew its lease."""
        if self.is_draining:
            try:
                await self.queue.release([entry_id])
            finally:
                if slot is not None:
                    await slot.aclose()
            log.info("request %s: admitted while draining; handed to the other gateway processes", run.request_id)
            return
        run.entry_id = entry_id
        self._start(run, slot, is_detachable)

    def _start(self, run: JournaledRun, slot: contextlib.AsyncExitStack | None, is_detachable: bool) -> None:
        task = self.runs.start(run, slot, is_detachable)
        task.add_done_callback(lambda done: self._ended(run, done))

    def _ended(self, run: JournaledRun, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None or task.result() == HANDED_OVER:
            return  # not over: whoever runs it next acknowledges it
        if task.result() == UNRECORDED:
            # Not over either, but this process's heartbeat would keep its lease, and so its readers waiting,
            # forever: released, it is run again by the next reclaim (this process's, or another's).
            if run.entry_id is not None:
                self._unrecorded.add(run.entry_id)
            return
        asyncio.get_running_loop().create_task(self._done(run))

    async def _done(self, run: JournaledRun) -> None:
        try:
            await self.queue.done(run.entry_id)
        except ChorusError as exc:  # the entry stays; a reclaim finds the run ended and acknowledges it
            log.warning("request %s: could not acknowledge its run: %s", run.request_id, exc)

    def start(self, continue_run: ContinueRun) -> None:
        self._loop = exit_if_it_fails(asyncio.create_task(self._keep(continue_run), name="run-broker"), "run leases")

    async def _keep(self, continue_run: ContinueRun) -> None:
        interval_s = self.queue.lease_s / 4
        while not self.is_draining:
            try:
                await self._release_unrecorded()
                await self._renew()
                await self._reclaim(continue_run)
            except (ChorusError, *REDIS_ERRORS) as exc:
                log.warning("run leases: %s; retrying", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._draining.wait(), interval_s)

    async def _release_unrecorded(self) -> None:
        if self._unrecorded:
            entry_ids = sorted(self._unrecorded)
            await self.queue.release(entry_ids)  # Redis still failing: tried again next tick
            self._unrecorded.difference_update(entry_ids)

    async def _renew(self) -> None:
        runs = self.runs.live_runs()  # before the heartbeat: a run queued meanwhile is not in its answer
        owned = await self.queue.heartbeat()
        for run in runs:
            # Still running: one that ended meanwhile had its entry acknowledged, which is not a loss.
            if run.entry_id is not None and run.entry_id not in owned and self.runs.is_running(run.request_id):
                RUNS_LOST.inc()
                log.warning("request %s: another gateway process took its run over", run.request_id)
                self.runs.hand_over(run.request_id)

    async def _reclaim(self, continue_run: ContinueRun) -> None:
        if self.is_draining:
            return
        entries = await self.queue.reclaim()
        for index, entry in enumerate(entries):
            if self.is_draining:
                await self._release_unstarted(entries[index:])
                return
            if self.runs.is_running(entry.request_id):
                continue  # ours all along: its lease lapsed while this process was busy, and now it is renewed
            started = time.monotonic()
            try:
                run = await continue_run(entry)
            except ChorusError:
                raise  # Redis: the entry stays for the next try
            except Exception:  # an entry no version of this gateway can run: say so once, and drop it
                log.exception("request %s: its run cannot be continued; dropped", entry.request_id)
                run = None
            if run is None:  # it had ended, or cannot run
                await self.queue.done(entry.entry_id)
                continue
            if self.is_draining:
                await self._release_unstarted(entries[index:])
                return
            run.entry_id = entry.entry_id
            RUNS_TAKEN_OVER.inc()
            log.warning(
                "request %s: took over its run from a gateway process that stopped renewing it (%.0f ms)",
                entry.request_id,
                (time.monotonic() - started) * 1000,
            )
            self._start(run, None, is_detachable=False)

    async def _release_unstarted(self, entries: list[RunEntry]) -> None:
        """The drain began during this tick: the entries it claimed and did not start go to the other processes."""
        await self.queue.release([entry.entry_id for entry in entries])

    async def hand_over(self) -> int:
        """Stops taking runs, and hands every run of this process to the others; returns how many."""
        self.is_draining = True
        self._draining.set()
        if self._loop is not None:  # its tick under way ends first: a claim after the release takes the runs back
            await asyncio.wait([self._loop])
        runs = self.runs.live_runs()
        for run in runs:
            self.runs.hand_over(run.request_id)
        await self.runs.stopped(run.request_id for run in runs)
        await self.queue.release([run.entry_id for run in runs if run.entry_id is not None] + sorted(self._unrecorded))
        if runs:
            log.info("handed %d runs over to the other gateway processes", len(runs))
        return len(runs)

    async def close(self) -> None:
        if self._loop is not None:
            await cancel_and_wait([self._loop], "run broker")  # its Redis commands can lose a cancel

"""Admission counts that the worker processes of one gateway (`--workers N`) share, so that together they admit
what the backends serve wherever the kernel sent the connections.

The workers share their ports through SO_REUSEPORT, which hands each new connection to a worker by a hash, not by
load. Were each worker to admit a fixed 1/N of a backend's slots, the one that got more connections would queue
requests, each for a whole request's duration, while another's slots sat idle: 256 streams over 4 workers of 64
left on average 11 requests (4.3 %) waiting, the slowest 5 % of times to first audio at 256 on an H100 (~2.8 s
against a p90 of ~850 ms). Here a take compares the count of every worker with the one limit instead.

The counts sit in a small file that every worker maps: one int64 cell per (backend, worker), each written only by
its worker (an aligned 8-byte store, which readers see whole); a take sums a backend's cells and adds to its own
under an exclusive `flock` on the file, so that concurrent takes never pass the limit together. The lock is only
ever tried, never waited for: a worker stopped while it held it (SIGSTOP) must not freeze the others' event loops,
so a take that finds it held fails as a full backend does, and the request waits and tries again. No count outlives
its worker: a worker that dies stops the whole gateway (`chorus.gateway.workers`), and one starting zeroes its cells.
"""

from __future__ import annotations

import fcntl
import mmap
import os

KINDS = ("talker", "vocoder", "diffusion")
ENV = "CHORUS_GATEWAY_HOST_SLOTS"  # "path:worker:num_workers", set by the supervisor for each worker
_CELL_BYTES = 8


def create(path: str, num_workers: int) -> None:
    """The zeroed file of `num_workers` workers' counts (the supervisor, before it starts them)."""
    with open(path, "wb") as file:
        file.write(bytes(len(KINDS) * num_workers * _CELL_BYTES))


def worker_environ(path: str, worker: int, num_workers: int) -> dict[str, str]:
    return {ENV: f"{path}:{worker}:{num_workers}"}


class HostSlots:
    """This worker's view of the host's counts."""

    def __init__(self, path: str, worker: int, num_workers: int) -> None:
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker: must be in [0, {num_workers}), got {worker}")
        self.worker = worker
        self.num_workers = num_workers
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, len(KINDS) * num_workers * _CELL_BYTES)
        self._counts = memoryview(self._map).cast("q")
        for kind in KINDS:
            self._counts[self._cell(kind)] = 0

    @classmethod
    def from_environ(cls, environ: dict[str, str] = os.environ) -> HostSlots | None:
        """The counts a supervisor shares with this worker, or None for a gateway of one process."""
        value = environ.get(ENV)
        if not value:
            return None
        path, worker, num_workers = value.rsplit(":", 2)
        return cls(path, int(worker), int(num_workers))

    def total(self, kind: str) -> int:
        """Slots of backend `kind` that the host's workers hold now."""
        first = KINDS.index(kind) * self.num_workers
        return sum(self._counts[first : first + self.num_workers])

    def try_take(self, kind: str, limit: int) -> bool:
        """One slot of `kind` for this worker, if the workers together hold fewer than `limit` (and no other worker
        is taking one at this instant)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            if self.total(kind) >= limit:
                return False
            self._counts[self._cell(kind)] += 1
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def give_back(self, kind: str) -> None:
        assert self._counts[self._cell(kind)] > 0, "give_back without take"
        self._counts[self._cell(kind)] -= 1

    def _cell(self, kind: str) -> int:
        return KINDS.index(kind) * self.num_workers + self.worker

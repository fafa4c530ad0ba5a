"""Restarts the children of `chorus up` that die, with exponential backoff, the way Kubernetes restarts a
crashed container.

A child that dies while the stack is up is started again after `initial_delay_s`; the delay doubles with
every restart that follows a short run, up to `max_delay_s`, and goes back to `initial_delay_s` once the
child has stayed up `reset_after_s` (Kubernetes: 10 s doubling to 5 min, reset after 10 min; local processes
start in seconds, so these defaults are shorter). Every death, restart and recovery is one log line naming
the child, how it ended, the delay and the restart count.

Nothing here runs on its own: the owner calls `poll` every fraction of a second while the stack is up and
stops calling it once the stack stops, so a stopping `chorus up` never restarts anything.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_delay_s: float = 0.5
    max_delay_s: float = 30.0
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_delay_s <= self.max_delay_s:
            raise ValueError(f"restart delays: need 0 < initial ≤ max, got {self.initial_delay_s}, {self.max_delay_s}")

    def delay_s(self, num_quick_restarts: int) -> float:
        """The wait before a restart that follows `num_quick_restarts` restarts with no long run in between."""
        return min(self.max_delay_s, self.initial_delay_s * 2 ** min(num_quick_restarts, 32))


def describe_exit(returncode: int) -> str:
    """How a child ended: "killed by SIGKILL" (Popen's negative return code) or "exited with code 1"."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass
class _Child:
    spawn: Callable[[], subprocess.Popen]
    process: subprocess.Popen | None
    started_at_s: float
    num_restarts: int = 0
    num_quick_restarts: int = 0  # the backoff exponent: restarts since the last run of `reset_after_s` or more
    restart_at_s: float | None = None  # while dead: when it starts again
    died_at_s: float | None = None  # since a death, until the restarted process serves again


class Supervisor:
    """Named child processes, each made by its `spawn` function, and made again when it dies.

    `is_serving(name)` says whether a restarted child serves again (for the recovery log line); `log` gets
    one line per event.
    """

    def __init__(
        self,
        policy: RestartPolicy,
        log: Callable[[str], None],
        is_serving: Callable[[str], bool] = lambda name: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.log = log
        self.is_serving = is_serving
        self.clock = clock
        self._children: dict[str, _Child] = {}

    def start(self, name: str, spawn: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        """Starts a child now (an error here is the caller's: nothing is supervised yet)."""
        process = spawn()
        self._children[name] = _Child(spawn, process, self.clock())
        return process

    @property
    def processes(self) -> dict[str, subprocess.Popen | None]:
        """The current process of each child (None while a failed start waits for its retry)."""
        return {name: child.process for name, child in self._children.items()}

    def num_restarts(self, name: str) -> int:
        return self._children[name].num_restarts

    def poll(self) -> None:
        """Notices dead children, restarts those whose delay is over, reports those serving again."""
        for name, child in self._children.items():
            now = self.clock()
            if child.restart_at_s is None and child.process is not None and child.process.poll() is not None:
                self._schedule(name, child, now, describe_exit(child.process.returncode))
            if child.restart_at_s is not None and now >= child.restart_at_s:
                self._restart(name, child, now)
            elif child.restart_at_s is None and child.died_at_s is not None and self.is_serving(name):
                self.log(f"{name} is serving again, {self.clock() - child.died_at_s:.1f} s after it went down")
                child.died_at_s = None

    def _schedule(self, name: str, child: _Child, now: float, how: str) -> None:
        uptime_s = now - child.started_at_s
        if uptime_s >= self.policy.reset_after_s:
            child.num_quick_restarts = 0
        delay_s = self.policy.delay_s(child.num_quick_restarts)
        child.num_quick_restarts += 1
        child.num_restarts += 1
        child.restart_at_s = now + delay_s
        child.died_at_s = child.died_at_s if child.died_at_s is not None else now
        self.log(f"{name} {how} after {uptime_s:.1f} s up; restart {child.num_restarts} in {delay_s:.1f} s")

    def _restart(self, name: str, child: _Child, now: float) -> None:
        child.restart_at_s = None
        child.started_at_s = now
        try:
            child.process = child.spawn()
        except (OSError, RuntimeError) as exc:
            child.process = None
            self._schedule(name, child, now, f"could not be started ({exc})")
            return
        self.log(f"{name} restarted (restart {child.num_restarts}, pid {child.process.pid})")

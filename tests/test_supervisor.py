"""The restart policy of `chorus up` on a fake clock and fake processes (real ones: tests/e2e/test_stack.py)."""

from __future__ import annotations

import itertools
import signal

import pytest

from chorus.stack import LocalStack, StackPorts
from chorus.supervisor import RestartPolicy, Supervisor, describe_exit


class FakeProcess:
    pids = itertools.count(100)

    def __init__(self) -> None:
        self.pid = next(self.pids)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def world():
    clock, lines, spawned = Clock(), [], []
    serving = {"talker": False}

    def spawn() -> FakeProcess:
        spawned.append(FakeProcess())
        return spawned[-1]

    supervisor = Supervisor(
        RestartPolicy(initial_delay_s=0.5, max_delay_s=4.0, reset_after_s=60.0),
        lines.append,
        is_serving=lambda name: serving[name],
        clock=clock,
    )
    supervisor.start("talker", spawn)
    return supervisor, clock, lines, spawned, serving


def test_backoff_doubles_to_the_cap():
    policy = RestartPolicy(initial_delay_s=0.5, max_delay_s=30.0)
    assert [policy.delay_s(n) for n in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert policy.delay_s(10_000) == 30.0
    with pytest.raises(ValueError, match="restart delays"):
        RestartPolicy(initial_delay_s=0.0)


def test_exits_are_described_by_code_or_signal():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(0) == "exited with code 0"


def test_a_dead_child_restarts_after_its_delay_and_says_so(world):
    supervisor, clock, lines, spawned, serving = world
    clock.now_s += 5.0
    spawned[-1].returncode = -signal.SIGKILL
    supervisor.poll()
    assert lines == ["talker killed by SIGKILL after 5.0 s up; restart 1 in 0.5 s"]
    clock.now_s += 0.4
    supervisor.poll()
    assert len(spawned) == 1, "not before the delay is over"
    clock.now_s += 0.1
    supervisor.poll()
    assert len(spawned) == 2 and supervisor.processes["talker"] is spawned[-1]
    assert lines[-1] == f"talker restarted (restart 1, pid {spawned[-1].pid})"
    clock.now_s += 2.0
    supervisor.poll()
    assert len(lines) == 2, "no recovery line while it is not serving yet"
    serving["talker"] = True
    supervisor.poll()
    assert lines[-1] == "talker is serving again, 2.5 s after it went down"
    supervisor.poll()
    assert len(lines) == 3 and supervisor.num_restarts("talker") == 1


def test_quick_deaths_back_off_and_a_long_run_resets_the_delay(world):
    supervisor, clock, lines, spawned, _ = world
    delays = []
    for _ in range(6):  # each run crashes after 1 s
        clock.now_s += 1.0
        spawned[-1].returncode = 1
        supervisor.poll()
        delays.append(float(lines[-1].rsplit(" in ", 1)[1].removesuffix(" s")))
        clock.now_s += delays[-1]
        supervisor.poll()  # restarted now
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert "exited with code 1 after 1.0 s up; restart 6" in lines[-2]

    clock.now_s += 61.0  # this run outlasts reset_after_s
    spawned[-1].returncode = 1
    supervisor.poll()
    assert lines[-1].endswith("restart 7 in 0.5 s")


def test_a_child_that_cannot_be_started_is_retried_with_backoff():
    clock, lines, attempts = Clock(), [], []

    def spawn() -> FakeProcess:
        attempts.append(clock.now_s)
        if len(attempts) > 1:
            raise OSError("port in use")
        return FakeProcess()

    supervisor = Supervisor(RestartPolicy(initial_delay_s=1.0, max_delay_s=8.0), lines.append, clock=clock)
    supervisor.start("redis", spawn).returncode = -signal.SIGTERM
    for _ in range(20):
        supervisor.poll()
        clock.now_s += 0.5
    assert lines[0].startswith("redis killed by SIGTERM")
    assert "redis could not be started (port in use) after 0.0 s up; restart 2 in 2.0 s" in lines
    assert [later - earlier for earlier, later in itertools.pairwise(attempts[1:])] == [2.0, 4.0]
    assert supervisor.processes["redis"] is None


def test_with_restarts_off_the_stack_reports_the_first_death_and_restarts_nothing():
    stack = LocalStack(StackPorts.choose(0, 0), redis_url="redis://127.0.0.1:1/0", restart_policy=None)
    processes = {name: FakeProcess() for name in ("talker", "gateway")}
    for name, process in processes.items():
        stack.supervisor.start(name, lambda process=process: process)
    assert stack.watch() is None
    processes["gateway"].returncode = -signal.SIGSEGV
    assert stack.watch() == ("gateway", -signal.SIGSEGV)
    assert stack.supervisor.num_restarts("gateway") == 0


def test_a_stacks_free_ports_are_distinct():
    # The talker and the gateway's REST server once got the same port and both bound it (SO_REUSEPORT): the
    # talker's health checks reached the REST server and the stack never came up.
    for _ in range(20):
        ports = StackPorts.choose(0, 0)
        named = [ports.rest, *(port for name, port in ports.grpc.items() if name != "speech")]
        assert len(set(named)) == len(named), ports
        assert ports.grpc["speech"] == ports.grpc["talker"]

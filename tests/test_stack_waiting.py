"""`chorus up` while a service is still starting: it says what it waits for, every so often, and gives up at its
timeout naming the service (a real child process that never serves: a service still warming up)."""

from __future__ import annotations

import itertools
import subprocess

import pytest

from chorus.stack import LocalStack, StackPorts


def test_a_service_that_does_not_serve_yet_is_named_while_waiting_and_at_the_timeout():
    stack = LocalStack(StackPorts.choose(0, 0), redis_url="redis://127.0.0.1:1/0", log=lambda line: None)
    warming_up = stack.supervisor.start("talker", lambda: subprocess.Popen(["sleep", "30"]))  # listens on nothing
    waits = []
    try:
        with pytest.raises(TimeoutError, match=r"not healthy: talker after 2 s"):
            stack.wait_ready(2.0, on_waiting=lambda pending, s: waits.append((pending, s)), progress_every_s=0.5)
    finally:
        warming_up.kill()
        warming_up.wait()
    assert len(waits) >= 2 and all(pending == ["talker"] for pending, _ in waits)
    seconds = [s for _, s in waits]  # one line every 0.5 s at most
    assert seconds[0] >= 0.5 and all(later - earlier >= 0.5 for earlier, later in itertools.pairwise(seconds))

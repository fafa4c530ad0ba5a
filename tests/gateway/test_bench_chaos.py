"""`chorus bench tts --chaos`: which process a kill reaches, and the fail-over gaps it reports."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import aiohttp
from ready_stub import serving_ready

from chorus.bench.chaos import Chaos, failover_gaps
from chorus.bench.local_processes import listeners
from chorus.bench.metrics import RequestTiming
from chorus.runtime.processes import free_ports

_LISTEN = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)"
)


def test_failover_gap_is_the_time_from_a_kill_to_the_next_audio_of_each_stream_in_flight():
    in_flight = RequestTiming(sent_at=0.0, arrivals=[(0.5, 0.1), (1.0, 0.1), (4.0, 0.1), (4.5, 0.1)])
    finished_before = RequestTiming(sent_at=0.0, arrivals=[(0.5, 0.1), (1.5, 0.1)])
    started_after = RequestTiming(sent_at=2.5, arrivals=[(3.0, 0.1)])
    assert failover_gaps([2.0], [in_flight, finished_before, started_after]) == [2.0]


async def test_a_kill_reaches_the_process_serving_a_healthy_replica_with_a_healthy_peer():
    *ports, lone = free_ports(3)  # lone: the only vocoder, never killed
    replicas = [subprocess.Popen([sys.executable, "-c", _LISTEN, str(port)]) for port in ports]
    lone_replica = subprocess.Popen([sys.executable, "-c", _LISTEN, str(lone)])
    backends = {"talker": {f"127.0.0.1:{port}": True for port in ports}, "vocoder": {f"127.0.0.1:{lone}": True}}

    try:
        for _ in range(50):  # the listeners are up
            if {listener.port for listener in listeners()} >= {*ports, lone}:
                break
            await asyncio.sleep(0.1)
        async with serving_ready(backends) as url, aiohttp.ClientSession(url) as session:
            kill = await Chaos(session, interval_s=1.0).kill_one()
        assert kill is not None and kill.backend == "talker"
        killed = replicas[ports.index(int(kill.target.rsplit(":", 1)[1]))]
        assert killed.wait(5) == -9
        assert all(p.poll() is None for p in (*replicas, lone_replica) if p is not killed)
    finally:
        for process in (*replicas, lone_replica):
            process.kill()
            process.wait()

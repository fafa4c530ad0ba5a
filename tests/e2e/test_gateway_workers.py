"""`chorus serve gateway --workers N`: worker processes share the REST and gRPC ports, connections spread over
them, /metrics reports all of them, they share the admission limits, SIGTERM
stops them all, and one worker's death stops the gateway."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.processes import free_ports

NUM_WORKERS = 2


@pytest.fixture
def gateway(redis_url):
    rest_port, grpc_port, metrics_port = free_ports(3)
    command = [sys.executable, "-m", "chorus.cli", "serve", "gateway", "--workers", str(NUM_WORKERS)]
    command += ["--rest-port", str(rest_port), "--port", str(grpc_port), "--metrics-port", str(metrics_port)]
    process = subprocess.Popen(
        command, env=os.environ | {"CHORUS_GATEWAY_REDIS_URL": redis_url}, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_serving(process, grpc_port)
        yield process, rest_port, metrics_port
    finally:
        workers = _children(process.pid)
        if process.poll() is None:
            process.kill()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _wait_serving(process: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 60
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        while True:
            assert process.poll() is None, process.stderr.read()
            with contextlib.suppress(grpc.RpcError):
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            assert time.monotonic() < deadline, "gateway workers not serving after 60 s"
            time.sleep(0.1)


def _children(pid: int) -> list[int]:
    with contextlib.suppress(FileNotFoundError):
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def _is_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"  # exited, not yet reaped
    except FileNotFoundError:
        return True


def _established_on(port: int) -> set[int]:
    """Socket inodes of established TCP connections whose local port is `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def test_workers_share_the_ports_and_report_one_set_of_metrics(gateway):
    process, rest_port, metrics_port = gateway
    workers = _children(process.pid)
    assert len(workers) == NUM_WORKERS
    with contextlib.ExitStack() as clients:
        connections = [clients.enter_context(httpx.Client(base_url=f"http://127.0.0.1:{rest_port}")) for _ in range(24)]
        for client in connections:  # each client keeps its own connection open
            assert client.get("/health").status_code == 200
        accepted = _established_on(rest_port)
        per_worker = [len(_socket_inodes(pid) & accepted) for pid in workers]
    assert sum(per_worker) == 24 and all(per_worker), per_worker  # all 24 on one worker: p ≈ 1e-7
    line = 'chorus_gateway_requests_total{endpoint="/health",outcome="200"} 24.0'
    assert line in httpx.get(f"http://127.0.0.1:{rest_port}/metrics").text
    metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert line in metrics
    # The workers share the gateway's admission limits (`host_slots`): a derived one (64 until a backend has
    # reported) and a set one (diffusion's 8) are each the limit of all of them together.
    assert 'chorus_gateway_max_in_flight{backend="talker"} 64.0' in metrics
    assert 'chorus_gateway_max_in_flight{backend="diffusion"} 8.0' in metrics
    # Each worker's garbage-collection pauses go to the shared files too (test_gc_pauses.py times them).
    assert 'chorus_gc_pause_seconds_count{generation="2"}' in metrics
    # And their event loops' lag, every worker's wake-ups in one histogram (test_loop_lag.py times them).
    [wakeups] = [line for line in metrics.splitlines() if line.startswith("chorus_event_loop_lag_seconds_count")]
    assert float(wakeups.split()[-1]) > 0, wakeups
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert all(_is_gone(pid) for pid in workers)


def test_a_worker_that_dies_stops_the_gateway(gateway):
    process, _, _ = gateway
    first, second = _children(process.pid)
    os.kill(first, signal.SIGKILL)
    assert process.wait(30) != 0
    assert _is_gone(second)
    assert "exited with code -9; stopping the others" in process.stderr.read()

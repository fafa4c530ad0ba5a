"""`chorus serve <service>`: what a container runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.processes import free_port


@pytest.mark.parametrize("service", ["talker", "vocoder", "diffusion"])
def test_serve_becomes_healthy_and_exits_zero_on_sigterm(service):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "chorus.cli", "serve", service, "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            while True:
                assert process.poll() is None, process.stderr.read()
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert "stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_serve_rejects_a_bad_setting_with_a_clear_message():
    result = subprocess.run(
        [sys.executable, "-m", "chorus.cli", "serve", "talker", "--port", "eighty"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--port: expected int, got 'eighty'" in result.stderr

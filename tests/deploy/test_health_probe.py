"""deploy/docker/grpc_health_probe.py, run as the container healthcheck runs it, against a real
grpc.health.v1 server."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from deploy_support import REPO
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

PROBE = REPO / "deploy" / "docker" / "grpc_health_probe.py"


@pytest.fixture(scope="module")
def health_server():
    """A gRPC server whose health reports chorus.v1.Talker SERVING and chorus.v1.Vocoder NOT_SERVING."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.set("chorus.v1.Talker", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("chorus.v1.Vocoder", health_pb2.HealthCheckResponse.NOT_SERVING)
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


@contextlib.contextmanager
def closed_port():
    """A loopback port bound (so no other test takes it) but not listening: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if not key.startswith("CHORUS_PROBE_")}
    return subprocess.run(
        [sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=30, env={**environ, **(env or {})}
    )


def test_serving_service_exits_zero(health_server):
    result = probe("--address", health_server, "--service", "chorus.v1.Talker")
    assert result.returncode == 0, result.stderr
    assert "SERVING" in result.stdout


def test_whole_server_status_is_the_default_service(health_server):
    # grpcio's servicer reports the "" service SERVING from the start.
    assert probe("--address", health_server).returncode == 0


def test_not_serving_service_fails(health_server):
    result = probe("--address", health_server, "--service", "chorus.v1.Vocoder")
    assert result.returncode == 1
    assert "NOT_SERVING" in result.stderr


def test_unknown_service_fails(health_server):
    result = probe("--address", health_server, "--service", "chorus.v1.Diffusion")
    assert result.returncode == 1
    assert "NOT_FOUND" in result.stderr


def test_unreachable_server_fails_within_the_timeout(health_server):
    with closed_port() as address:
        result = probe("--address", address, "--timeout-s", "1")
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr or "DEADLINE_EXCEEDED" in result.stderr


def test_address_and_service_come_from_the_environment(health_server):
    env = {"CHORUS_PROBE_ADDRESS": health_server, "CHORUS_PROBE_SERVICE": "chorus.v1.Vocoder"}
    assert probe(env=env).returncode == 1
    assert probe(env={**env, "CHORUS_PROBE_SERVICE": "chorus.v1.Talker"}).returncode == 0


def test_bad_timeout_is_a_usage_error():
    result = probe("--timeout-s", "0")
    assert result.returncode == 2
    assert "--timeout-s" in result.stderr

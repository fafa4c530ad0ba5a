"""`chorus up`: the whole stack as local processes — Redis, talker, vocoder, diffusion, gateway (or, with
`speech_in_one_process`, Redis, speech = talker + vocoder, diffusion, gateway).

Children run `chorus serve <name>` in their own process group (so a terminal Ctrl-C reaches only
this parent, which then drains them once with SIGTERM) and are asked by the kernel to die with
this parent, so even a killed `chorus up` leaves no orphans.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.processes import die_with_parent, free_port
from chorus.runtime.redis_server import LocalRedis, start_local_redis
from chorus.services import SERVICES

BACKENDS = ("talker", "vocoder", "diffusion")


@dataclass(frozen=True)
class StackPorts:
    rest: int
    grpc: dict[str, int]

    @classmethod
    def choose(cls, rest_port: int, grpc_port_base: int) -> StackPorts:
        """Fixed ports from the bases given, or free ones where a base is 0."""
        names = ("gateway", *BACKENDS)
        grpc_ports = {name: (grpc_port_base + i if grpc_port_base else free_port()) for i, name in enumerate(names)}
        grpc_ports["speech"] = grpc_ports["talker"]  # the one-process talker + vocoder takes the talker's port
        return cls(rest=rest_port or free_port(), grpc=grpc_ports)


@dataclass
class LocalStack:
    ports: StackPorts
    redis_url: str | None = None
    redis_dir: Path | None = None  # the embedded Redis's data (its append-only file); None: a fresh temporary one
    log_format: str = "text"
    grace_s: float = 10.0
    extra_env: dict[str, str] = field(default_factory=dict)
    speech_in_one_process: bool = False
    children: dict[str, subprocess.Popen] = field(default_factory=dict)
    redis: LocalRedis | None = None

    def start(self) -> None:
        if self.redis_url is None:
            self.redis = start_local_redis(self.redis_dir or Path(tempfile.mkdtemp(prefix="chorus-redis-")))
            self.redis_url = self.redis.url
        for name in (*self.backend_processes, "gateway"):
            self.children[name] = subprocess.Popen(
                [sys.executable, "-m", "chorus.cli", "serve", name],
                env=self._env_for(name),
                start_new_session=True,
                preexec_fn=die_with_parent,
            )

    @property
    def backend_processes(self) -> tuple[str, ...]:
        return ("speech", "diffusion") if self.speech_in_one_process else BACKENDS

    def backend_port(self, backend: str) -> int:
        """The port serving `backend` (talker, vocoder or diffusion)."""
        return self.ports.grpc["speech" if self.speech_in_one_process and backend != "diffusion" else backend]

    def _env_for(self, name: str) -> dict[str, str]:
        prefix = SERVICES[name].load_config_class().env_prefix
        env = {**os.environ, **self.extra_env}
        env[prefix + "PORT"] = str(self.ports.grpc[name])
        env[prefix + "GRACE_S"] = str(self.grace_s)
        env[prefix + "LOG_FORMAT"] = self.log_format
        env.setdefault(prefix + "METRICS_PORT", "0")
        if name == "gateway":
            env[prefix + "REST_PORT"] = str(self.ports.rest)
            env[prefix + "REDIS_URL"] = self.redis_url or ""
            for backend in BACKENDS:
                env[f"{prefix}{backend.upper()}_TARGETS"] = f"127.0.0.1:{self.backend_port(backend)}"
        return env

    def wait_ready(self, timeout_s: float, on_ready=lambda name, seconds: None) -> None:
        """Blocks until every service is SERVING and the gateway's /ready is true."""
        started = time.monotonic()
        pending = set(self.children)
        while pending:
            for name in sorted(pending):
                self._raise_if_exited(name)
                if self._is_serving(name):
                    pending.discard(name)
                    on_ready(name, time.monotonic() - started)
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"not healthy after {timeout_s:.0f} s: {', '.join(sorted(pending))}")
            time.sleep(0.2)
        while not self._is_gateway_ready():
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"gateway /ready still false after {timeout_s:.0f} s")
            time.sleep(0.2)

    def _raise_if_exited(self, name: str) -> None:
        code = self.children[name].poll()
        if code is not None:
            raise RuntimeError(f"{name} exited with code {code} (see its log above)")

    def _is_serving(self, name: str) -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{self.ports.grpc[name]}") as channel:
            request = health_pb2.HealthCheckRequest(service=SERVICES[name].grpc_service)
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=1.0)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _is_gateway_ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.ports.rest}/ready", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def first_exited(self) -> tuple[str, int] | None:
        for name, child in self.children.items():
            if child.poll() is not None:
                return name, child.returncode
        return None

    def stop(self) -> dict[str, int]:
        """SIGTERM to every child, SIGKILL after the grace period; then Redis. Returns exit codes."""
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + 5.0
        codes = {}
        for name, child in self.children.items():
            try:
                codes[name] = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                codes[name] = child.wait()
        if self.redis is not None:
            self.redis.stop()
        return codes

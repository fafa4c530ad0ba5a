"""A local cluster for fault tests: several replicas of every service as real `chorus serve` processes on
loopback (tiny CPU models, a real Redis), a supervisor that restarts a process that died (as Kubernetes or
`chorus up` would), and the clients a user would write: each survives a gateway process going away by
resuming its request on another one (idempotency key before the request id is known, `offset_bytes` or
`Last-Event-ID` after).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.processes import free_ports
from chorus.services import SERVICES
from chorus.stack import gateway_ready

BACKENDS = ("talker", "vocoder", "diffusion")


@dataclasses.dataclass
class Member:
    name: str  # e.g. "talker-1"
    kind: str
    port: int
    rest_port: int | None = None  # gateways
    process: subprocess.Popen | None = None
    is_stopped: bool = False  # SIGSTOPped
    restarts: int = 0


class Cluster:
    def __init__(self, redis_url: str, log_dir: Path, replicas: dict[str, int], gateways: int, env: dict) -> None:
        self.redis_url = redis_url
        self.log_dir = log_dir
        self.env = env
        ports = iter(free_ports(sum(replicas[kind] for kind in BACKENDS) + 2 * gateways))  # distinct
        self.members: list[Member] = [
            Member(f"{kind}-{index}", kind, next(ports)) for kind in BACKENDS for index in range(replicas[kind])
        ]
        self.members += [Member(f"gateway-{i}", "gateway", next(ports), next(ports)) for i in range(gateways)]
        self._supervising = False
        self._supervisor: threading.Thread | None = None
        self._lock = threading.Lock()

    def of(self, kind: str) -> list[Member]:
        return [member for member in self.members if member.kind == kind]

    @property
    def gateway_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{member.rest_port}" for member in self.of("gateway")]

    def _environ(self, member: Member) -> dict[str, str]:
        prefix = SERVICES[member.kind].load_config_class().env_prefix
        env = os.environ | self.env | {prefix + "PORT": str(member.port), prefix + "METRICS_PORT": "-1"}
        if member.kind == "gateway":
            env[prefix + "REST_PORT"] = str(member.rest_port)
            env[prefix + "REDIS_URL"] = self.redis_url
            for kind in BACKENDS:
                env[f"{prefix}{kind.upper()}_TARGETS"] = ",".join(f"127.0.0.1:{m.port}" for m in self.of(kind))
        return env

    def _spawn(self, member: Member) -> None:
        log = open(self.log_dir / f"{member.name}.log", "a")  # noqa: SIM115 - the child holds it
        member.process = subprocess.Popen(
            [sys.executable, "-m", "chorus.cli", "serve", member.kind],
            env=self._environ(member),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        member.is_stopped = False

    def start(self, timeout_s: float = 120.0) -> None:
        for member in self.members:
            self._spawn(member)
        deadline = time.monotonic() + timeout_s
        for member in self.members:
            while not self.is_serving(member):
                assert member.process.poll() is None, f"{member.name} exited; see {self.log_dir}"
                assert time.monotonic() < deadline, f"{member.name} not serving after {timeout_s:.0f} s"
                time.sleep(0.2)
        # A gateway serves before its health probes have seen the backends serve (until then it answers 503):
        # wait for its readiness, as a load balancer would.
        for url in self.gateway_urls:
            while not gateway_ready(url):
                assert time.monotonic() < deadline, f"{url} not ready after {timeout_s:.0f} s"
                time.sleep(0.2)
        self._supervising = True
        self._supervisor = threading.Thread(target=self._supervise, daemon=True)
        self._supervisor.start()

    def is_serving(self, member: Member, timeout_s: float = 1.0) -> bool:
        if member.process is None or member.process.poll() is not None or member.is_stopped:
            return False
        service = SERVICES[member.kind].grpc_service
        with grpc.insecure_channel(f"127.0.0.1:{member.port}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
                )
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _supervise(self) -> None:
        """Restarts a member that died, a second later (a supervisor's backoff)."""
        while self._supervising:
            with self._lock:
                for member in self.members:
                    if member.process.poll() is not None and self._supervising:
                        time.sleep(1.0)
                        member.restarts += 1
                        self._spawn(member)
            time.sleep(0.2)

    def kill(self, member: Member) -> None:
        with self._lock:
            member.process.send_signal(signal.SIGKILL)
            member.process.wait()

    def stop(self, member: Member) -> None:
        member.is_stopped = True
        member.process.send_signal(signal.SIGSTOP)

    def resume(self, member: Member) -> None:
        member.process.send_signal(signal.SIGCONT)
        member.is_stopped = False

    def terminate(self, member: Member) -> None:
        """SIGTERM (a rolling restart): the supervisor starts it again once it exited."""
        member.process.send_signal(signal.SIGTERM)

    def close(self) -> None:
        self._supervising = False
        if self._supervisor is not None:
            self._supervisor.join(5)
        for member in self.members:
            if member.process is not None and member.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(member.process.pid, signal.SIGCONT)
                    os.killpg(member.process.pid, signal.SIGKILL)
                member.process.wait()


@contextlib.contextmanager
def two_of_everything(redis_url: str, log_dir: Path, env: dict | None = None):
    """Two gateway processes and two replicas of every backend, serving; their clients may resume through the
    other gateway (a run keeps going that long after its last reader left)."""
    env = {"CHORUS_GATEWAY_RECONNECT_GRACE_S": "10", "CHORUS_GATEWAY_HEALTH_INTERVAL_S": "0.5"} | (env or {})
    cluster = Cluster(redis_url, log_dir, {"talker": 2, "vocoder": 2, "diffusion": 2}, gateways=2, env=env)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


# ---- clients that resume across gateway processes ----


@dataclasses.dataclass
class Outcome:
    kind: str
    key: str
    request_id: str | None = None
    data: bytes = b""
    error: str | None = None
    chunk_times: list[float] = dataclasses.field(default_factory=list)  # monotonic time of every piece received
    reconnects: int = 0


class Gone(Exception):
    """The gateway went away mid-request (connection lost, or no answer): resume elsewhere."""


_RETRYABLE_STATUS = {502, 503, 504}


async def _gateway_alive(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(f"{url}/health", timeout=1.0)).status_code == 200
    except httpx.HTTPError:
        return False


class ResumingClient:
    """Sends one request and gets its whole output whichever gateway processes die meanwhile."""

    def __init__(self, urls: list[str], deadline_s: float, read_timeout_s: float = 5.0) -> None:
        self.urls = urls
        self.deadline_s = deadline_s
        self.timeout = httpx.Timeout(10.0, read=read_timeout_s, connect=1.0)
        self._requests = itertools.count()  # requests go to the gateways in turn

    async def _gateways(self, http: httpx.AsyncClient, preferred: int):
        """Gateway URLs to try, the preferred one first while it answers its health check."""
        order = self.urls[preferred:] + self.urls[:preferred]
        alive = [url for url in order if await _gateway_alive(http, url)]
        return alive or order

    async def _with_resume(self, outcome: Outcome, attempt) -> Outcome:
        deadline = time.monotonic() + self.deadline_s
        preferred = next(self._requests) % len(self.urls)
        async with httpx.AsyncClient(timeout=self.timeout) as http:
            last_gone = ""
            while True:
                for url in await self._gateways(http, preferred):
                    try:
                        await attempt(http, url)
                        return outcome
                    except Gone as gone:
                        outcome.reconnects += 1
                        last_gone = str(gone) or repr(gone.__cause__)
                    except _Failed as failed:
                        outcome.error = str(failed)
                        return outcome
                if time.monotonic() > deadline:
                    outcome.error = f"hung: no complete answer within {self.deadline_s:.0f} s (last: {last_gone})"
                    return outcome
                await asyncio.sleep(0.3)

    async def speech(self, body: dict) -> Outcome:
        """Streamed speech (raw audio bytes, or SSE when body says so)."""
        is_sse = body.get("stream_format") == "sse"
        outcome = Outcome("sse" if is_sse else "stream", str(uuid.uuid4()))
        state = {"request_id": None, "last_event_id": None}

        async def attempt(http: httpx.AsyncClient, url: str) -> None:
            if state["request_id"] is None:
                request = http.build_request(
                    "POST", f"{url}/v1/audio/speech", json=body, headers={"Idempotency-Key": outcome.key}
                )
            else:
                params = {"stream_format": "sse"} if is_sse else {"offset_bytes": len(outcome.data)}
                headers = {"Last-Event-ID": str(state["last_event_id"])} if state["last_event_id"] is not None else {}
                request = http.build_request(
                    "GET", f"{url}/v1/requests/{state['request_id']}/audio", params=params, headers=headers
                )
            async with _sending(http, request) as response:
                await _check(response, http, url, state["request_id"])
                state["request_id"] = state["request_id"] or response.headers.get("x-request-id")
                outcome.request_id = state["request_id"]
                if is_sse:
                    await _read_sse(response, outcome, state)
                else:
                    await _read_bytes(response, outcome)
            if not is_sse:
                return
            if state.get("done") is None:
                raise Gone()

        return await self._with_resume(outcome, attempt)

    async def generation(self, body: dict) -> Outcome:
        """An async text-to-audio job: submit, wait for it, download."""
        outcome = Outcome("audio", str(uuid.uuid4()))
        state = {"request_id": None, "deadline": time.monotonic() + self.deadline_s}

        async def attempt(http: httpx.AsyncClient, url: str) -> None:
            if state["request_id"] is None:
                request = http.build_request(
                    "POST",
                    f"{url}/v1/audio/generations",
                    json=body | {"mode": "async"},
                    headers={"Idempotency-Key": outcome.key},
                )
                async with _sending(http, request) as response:
                    await _check(response, http, url, None)
                    state["request_id"] = outcome.request_id = json.loads(await response.aread())["id"]
            while time.monotonic() < state["deadline"]:
                record = await _get_json(http, f"{url}/v1/requests/{state['request_id']}")
                if record["status"] == "done":
                    break
                if record["status"] in ("failed", "cancelled"):
                    raise _Failed(f"{record['status']}: {record.get('error')}")
                await asyncio.sleep(0.2)
            else:
                raise _Failed(f"hung: still {record['status']} after {self.deadline_s:.0f} s")
            async with _sending(http, http.build_request("GET", f"{url}/v1/requests/{state['request_id']}/audio")) as r:
                await _check(r, http, url, state["request_id"])
                await _read_bytes(r, outcome)

        return await self._with_resume(outcome, attempt)


class _Failed(Exception):
    """The request ended with an error: a final answer, not a reason to retry."""


@contextlib.asynccontextmanager
async def _sending(http: httpx.AsyncClient, request: httpx.Request):
    try:
        response = await http.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise Gone() from exc
    try:
        yield response
    except httpx.HTTPError as exc:
        raise Gone() from exc
    finally:
        with contextlib.suppress(httpx.HTTPError):
            await response.aclose()


async def _get_json(http: httpx.AsyncClient, url: str) -> dict:
    try:
        response = await http.get(url)
    except httpx.HTTPError as exc:
        raise Gone() from exc
    if response.status_code in _RETRYABLE_STATUS:
        raise Gone()
    response.raise_for_status()
    return response.json()


async def _check(response: httpx.Response, http: httpx.AsyncClient, url: str, request_id: str | None) -> None:
    """Returns for a 200; raises Gone for an answer worth retrying elsewhere, _Failed for a final error."""
    if response.status_code == 200 or response.status_code == 202:
        return
    body = (await response.aread()).decode(errors="replace")[:300]
    if request_id is not None:
        record = await _get_json(http, f"{url}/v1/requests/{request_id}")
        if record["status"] in ("failed", "cancelled"):
            raise _Failed(f"{record['status']}: {record.get('error')}")
    if response.status_code in _RETRYABLE_STATUS:
        raise Gone(f"HTTP {response.status_code}: {body}")
    raise _Failed(f"HTTP {response.status_code}: {body}")


async def _read_bytes(response: httpx.Response, outcome: Outcome) -> None:
    data = bytearray(outcome.data)
    try:
        async for piece in response.aiter_raw():
            data += piece
            outcome.chunk_times.append(time.monotonic())
            outcome.data = bytes(data)
    except httpx.HTTPError as exc:
        raise Gone() from exc


async def _read_sse(response: httpx.Response, outcome: Outcome, state: dict) -> None:
    event_id = None
    try:
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                event_id = int(line[3:].strip())
            elif line.startswith("data:"):
                event = json.loads(line[5:].strip())
                if event["type"] == "speech.audio.delta":
                    outcome.data += base64.b64decode(event["audio"])
                    outcome.chunk_times.append(time.monotonic())
                    state["last_event_id"] = event_id
                elif event["type"] == "speech.audio.done":
                    state["done"] = True
                    return
                else:
                    raise _Failed(f"error event: {event}")
    except httpx.HTTPError as exc:
        raise Gone() from exc

"""`chorus up`: the whole stack as local processes — Redis, talker, vocoder, diffusion, gateway (or, with the
talker and vocoder in one process, Redis, speech = talker + vocoder, diffusion, gateway: by default where the stack
sees exactly one GPU, which they would share).

Children run `chorus serve <name>` in their own process group (so a terminal Ctrl-C reaches only
this parent, which then drains them once with SIGTERM) and are asked by the kernel to die with
this parent, so even a killed `chorus up` leaves no orphans. Once the stack is up, a child that dies
(the embedded Redis too, on its port, empty) is restarted with backoff (`chorus.supervisor`); the
gateway takes a restarted backend back at its next health check.

Each model process sees the GPUs its `CHORUS_<SERVICE>_GPU` names (talker, vocoder, diffusion; the names compose
reserves devices by): `chorus up` sets that child's CUDA_VISIBLE_DEVICES. The one-process speech service takes the
talker's. Where none is named and the stack sees two GPUs or more, the talker gets the first to itself and the
vocoder the second, which diffusion shares (a third GPU is diffusion's): on one GPU the vocoder's kernels slow the
talker's step (README, Talker and vocoder in one process).

Defaults follow the device: a talker on CUDA serves 256 streams (64 elsewhere), the gateway admits what its
backends report they serve, and where the talker runs on CUDA the gateway gets a process per core, at most
`CUDA_GATEWAY_WORKERS` (unless CHORUS_GATEWAY_WORKERS says otherwise), since one process cannot relay and encode
that many streams.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.runtime.config import load_config
from chorus.runtime.processes import die_with_parent, free_ports
from chorus.runtime.redis_server import LocalRedis, start_local_redis
from chorus.services import SERVICES
from chorus.supervisor import RestartPolicy, Supervisor, describe_exit

BACKENDS = ("talker", "vocoder", "diffusion")
# Gateway processes for a talker on CUDA (256 streams at its defaults), at most one per core: one process keeps up
# with about 64 speech streams, its core busy relaying, journaling and encoding them. Past 4 it is encoding that asks
# for more: each process encodes on its share of the cores, and threads of one process contend for its GIL between
# codec calls (README, Gateway workers): on a 16-core H200 host, 64 mp3 streams made 645 audio-s/s through 16
# processes of one encoder thread, 570 through 4 of 4 (pcm 635).
CUDA_GATEWAY_WORKERS = 16


def gpu_setting(service: str) -> str:
    """The environment variable naming the GPUs `service`'s process sees (`CUDA_VISIBLE_DEVICES` syntax)."""
    return f"CHORUS_{service.upper()}_GPU"


def gateway_workers(env: Mapping[str, str], cuda_available: Callable[[Mapping[str, str]], bool]) -> int | None:
    """The gateway processes the stack asks for where `env` sets none: one per core, at most `CUDA_GATEWAY_WORKERS`,
    when the talker will run on CUDA, by its device setting (`auto` asks `cuda_available`, as the talker resolves
    it); otherwise None, the gateway's own default."""
    if "CHORUS_GATEWAY_WORKERS" in env:
        return None
    try:
        device = load_config(SERVICES["talker"].load_config_class(), environ=env).device
    except ValueError:
        return None  # the talker reports its configuration error itself
    on_cuda = cuda_available(env) if device == "auto" else device.startswith("cuda")
    return min(CUDA_GATEWAY_WORKERS, len(os.sched_getaffinity(0))) if on_cuda else None


def torch_gpu_count(env: Mapping[str, str]) -> int:
    """The CUDA devices torch finds under `env` (CUDA_VISIBLE_DEVICES included). A child interpreter answers, so
    this supervising process never imports torch or initialises CUDA."""
    probe = [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"]
    try:
        answer = subprocess.run(probe, env=dict(env), capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return 0
    return int(answer.stdout.strip() or 0)


@dataclass(frozen=True)
class StackPorts:
    rest: int
    grpc: dict[str, int]

    @classmethod
    def choose(cls, rest_port: int, grpc_port_base: int) -> StackPorts:
        """Fixed ports from the bases given, or free ones where a base is 0."""
        names = ("gateway", *BACKENDS)
        free = iter(free_ports(len(names) + 1))  # distinct, whichever of them are used
        grpc_ports = {name: (grpc_port_base + i if grpc_port_base else next(free)) for i, name in enumerate(names)}
        grpc_ports["speech"] = grpc_ports["talker"]  # the one-process talker + vocoder takes the talker's port
        return cls(rest=rest_port or next(free), grpc=grpc_ports)


def _log_to_stderr(line: str) -> None:
    print(f"chorus up: {line}", file=sys.stderr, flush=True)


@dataclass
class LocalStack:
    ports: StackPorts
    redis_url: str | None = None
    redis_dir: Path | None = None  # the embedded Redis's data (its append-only file); None: a fresh temporary one
    log_format: str = "text"
    grace_s: float = 10.0
    extra_env: dict[str, str] = field(default_factory=dict)
    #: Talker and vocoder as one process (`chorus serve speech`); None: where they would share one GPU (see
    #: `speech_in_one`).
    speech_in_one_process: bool | None = None
    #: How dead children are restarted once the stack is up; None: not at all (`watch` reports the first death).
    restart_policy: RestartPolicy | None = field(default_factory=RestartPolicy)
    log: Callable[[str], None] = _log_to_stderr
    #: The GPUs torch finds under an environment: where the model processes go (`gpu_placement`), and whether the
    #: talker's `auto` device is CUDA (`gateway_workers`).
    gpu_count: Callable[[Mapping[str, str]], int] = torch_gpu_count
    redis: LocalRedis | None = None
    supervisor: Supervisor = field(init=False)

    def __post_init__(self) -> None:
        self.supervisor = Supervisor(self.restart_policy or RestartPolicy(), self.log, self._is_serving_again)
        named = self._named_gpus()
        talker_gpu, vocoder_gpu = named.get("talker"), named.get("vocoder")
        if self.speech_in_one_process and vocoder_gpu and vocoder_gpu != talker_gpu:
            raise ValueError(
                f"{gpu_setting('vocoder')}={vocoder_gpu} names another GPU than the talker's, but one process serves "
                "both with --speech-in-one-process: drop that flag to give each its own GPU"
            )

    def start(self) -> None:
        if self.redis_url is None:
            redis_dir = self.redis_dir or Path(tempfile.mkdtemp(prefix="chorus-redis-"))
            self.supervisor.start("redis", lambda: self._start_redis(redis_dir))
            self.redis_url = self.redis.url
        for name in (*self.backend_processes, "gateway"):
            self.supervisor.start(name, functools.partial(self._start_service, name))

    @property
    def children(self) -> dict[str, subprocess.Popen | None]:
        """The service processes (not Redis), by name."""
        return {name: process for name, process in self.supervisor.processes.items() if name != "redis"}

    def _start_service(self, name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "chorus.cli", "serve", name],
            env=self._env_for(name),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )

    def _start_redis(self, work_dir: Path) -> subprocess.Popen:
        """The embedded redis-server; a restart takes the same port (the gateway's URL names it) and reloads what
        its append-only file kept."""
        port = 0
        if self.redis is not None:
            port = self.redis.port
            self.redis.stop()  # reaps the dead server and lets go of its directory's lock
        self.redis = start_local_redis(work_dir, port=port)
        return self.redis.process

    @property
    def backend_processes(self) -> tuple[str, ...]:
        return ("speech", "diffusion") if self.speech_in_one else BACKENDS

    def backend_port(self, backend: str) -> int:
        """The port serving `backend` (talker, vocoder or diffusion)."""
        return self.ports.grpc["speech" if self.speech_in_one and backend != "diffusion" else backend]

    @functools.cached_property
    def speech_in_one(self) -> bool:
        """Whether talker and vocoder run as one process: as `speech_in_one_process` says, else where no GPU is named
        and the stack sees exactly one, which they would share (README, Talker and vocoder in one process)."""
        if self.speech_in_one_process is not None:
            return self.speech_in_one_process
        if self._named_gpus() or self.visible_gpus != 1:
            return False
        self.log("1 GPU: talker and vocoder in one process (--no-speech-in-one-process runs them apart)")
        return True

    def _environment(self) -> dict[str, str]:
        """What the children inherit before their own settings."""
        return {**os.environ, **self.extra_env}

    def _named_gpus(self) -> dict[str, str]:
        env = self._environment()
        return {name: env[gpu_setting(name)] for name in BACKENDS if env.get(gpu_setting(name))}

    @functools.cached_property
    def visible_gpus(self) -> int:
        """The GPUs this stack's environment shows torch, asked once."""
        return self.gpu_count(self._environment())

    @functools.cached_property
    def gpu_placement(self) -> dict[str, str]:
        """The GPUs (CUDA_VISIBLE_DEVICES) each model service's process sees, by service; one left out sees what
        the stack sees. Decided once, so a restarted process comes back on its GPU."""
        named = self._named_gpus()
        if named or self.speech_in_one or self.visible_gpus < 2:
            return named
        env, count = self._environment(), self.visible_gpus
        visible = env.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(count)))).split(",")
        placement = {"talker": visible[0], "vocoder": visible[1]}
        if env.get("CHORUS_DIFFUSION_PARALLEL", "none") == "none":  # a parallel DiT spreads over what it sees
            placement["diffusion"] = visible[2 if count > 2 else 1]
        where = ", ".join(f"{name} on {gpus}" for name, gpus in placement.items())
        self.log(f"{count} GPUs: {where} ({', '.join(map(gpu_setting, BACKENDS))} place them otherwise)")
        return placement

    @functools.cached_property
    def gateway_workers(self) -> int | None:
        """The gateway processes asked for (None: as CHORUS_GATEWAY_WORKERS or the gateway's default says), decided
        once, when the gateway first starts."""
        workers = gateway_workers(self._environment(), lambda env: self.visible_gpus > 0)
        if workers is not None:
            self.log(f"the talker runs on CUDA: {workers} gateway workers (CHORUS_GATEWAY_WORKERS sets another number)")
        return workers

    def _env_for(self, name: str) -> dict[str, str]:
        prefix = SERVICES[name].load_config_class().env_prefix
        env = self._environment()
        env[prefix + "PORT"] = str(self.ports.grpc[name])
        env[prefix + "GRACE_S"] = str(self.grace_s)
        env[prefix + "LOG_FORMAT"] = self.log_format
        env.setdefault(prefix + "METRICS_PORT", "0")
        gpus = self.gpu_placement.get("talker" if name == "speech" else name)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus
        if name == "gateway":
            env[prefix + "REST_PORT"] = str(self.ports.rest)
            env[prefix + "REDIS_URL"] = self.redis_url or ""
            for backend in BACKENDS:
                env[f"{prefix}{backend.upper()}_TARGETS"] = f"127.0.0.1:{self.backend_port(backend)}"
            if self.gateway_workers is not None:
                env[prefix + "WORKERS"] = str(self.gateway_workers)
        return env

    def wait_ready(
        self,
        timeout_s: float,
        on_ready=lambda name, seconds: None,
        on_waiting=lambda pending, seconds: None,
        progress_every_s: float = 30.0,
    ) -> None:
        """Blocks until every service is SERVING and the gateway's /ready is true. `on_waiting(pending, seconds)`
        every `progress_every_s` while some are not: on a GPU the models compile and capture their CUDA graphs for
        minutes, and a start that says nothing that long looks hung."""
        started = time.monotonic()
        next_progress_s = progress_every_s
        pending = set(self.children)
        while pending or not gateway_ready(f"http://127.0.0.1:{self.ports.rest}"):
            for name in sorted(pending):
                self._raise_if_exited(name)
                if self._is_serving(name):
                    pending.discard(name)
                    on_ready(name, time.monotonic() - started)
            waited_s = time.monotonic() - started
            if waited_s > timeout_s:
                what = f"not healthy: {', '.join(sorted(pending))}" if pending else "gateway /ready still false"
                raise TimeoutError(f"{what} after {timeout_s:.0f} s")
            if waited_s >= next_progress_s:
                on_waiting(sorted(pending) or ["gateway /ready"], waited_s)
                next_progress_s = waited_s + progress_every_s
            time.sleep(0.2)

    def _raise_if_exited(self, name: str) -> None:
        """A child that dies before the stack is first up fails `chorus up`: a restart would only repeat a
        configuration or environment error."""
        code = self.children[name].poll()
        if code is not None:
            raise RuntimeError(f"{name} {describe_exit(code)} (see its log above)")

    def _is_serving(self, name: str) -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{self.ports.grpc[name]}") as channel:
            request = health_pb2.HealthCheckRequest(service=SERVICES[name].grpc_service)
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=1.0)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _is_serving_again(self, name: str) -> bool:
        """For the supervisor's recovery line: Redis answers PING, a service reports SERVING."""
        if name == "redis":
            return self.redis is not None and self.redis.is_answering()
        return self._is_serving(name)

    def watch(self) -> tuple[str, int] | None:
        """One look at the children, every fraction of a second while the stack is up: restarts the dead after
        their backoff; with restarts off, returns the first dead one (name, return code) instead."""
        if self.restart_policy is not None:
            self.supervisor.poll()
            return None
        for name, child in self.supervisor.processes.items():
            if child is not None and child.poll() is not None:
                return name, child.returncode
        return None

    def stop(self) -> dict[str, int]:
        """SIGTERM to every child, SIGKILL after the grace period; then Redis. Returns exit codes (of the last
        process of each child; a negative code is the signal that killed it)."""
        children = {name: child for name, child in self.children.items() if child is not None}
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s + 5.0
        codes = {}
        for name, child in children.items():
            try:
                codes[name] = child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                codes[name] = child.wait()
        if self.redis is not None:
            self.redis.stop()
        return codes


def gateway_ready(rest_url: str) -> bool:
    """Whether the gateway at `rest_url` answers /ready with 200: it serves once its probes have seen its backends."""
    try:
        return httpx.get(f"{rest_url}/ready", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False

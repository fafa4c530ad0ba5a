"""`chorus up` as a newcomer runs it: real Redis, four service processes, clean stop, no orphans."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chorus.services import SERVICES

STARTUP_TIMEOUT_S = 120


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = set(), [pid]
    while frontier:
        for child in children.get(frontier.pop(), []):
            found.add(child)
            frontier.append(child)
    return found


def is_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def child_pid(parent: int, command_part: str) -> int:
    """The one process below `parent` whose command line contains `command_part`."""
    (pid,) = [pid for pid in descendants(parent) if command_part in command_line(pid)]
    return pid


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def start_stack(*flags: str, stderr_path: Path | None = None) -> tuple[subprocess.Popen, dict[str, str]]:
    """`chorus up` on free ports and its endpoints once it says it is up; its stderr (every process's log
    and the supervisor's lines) goes to `stderr_path` when given."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    command = [sys.executable, "-m", "chorus.cli", "up", "--rest-port", "0", "--grpc-port-base", "0", "--grace-s", "5"]
    command += ["--redis-dir", tempfile.mkdtemp(prefix="chorus-redis-")]
    with contextlib.ExitStack() as files:
        stderr = subprocess.DEVNULL if stderr_path is None else files.enter_context(stderr_path.open("w"))
        process = subprocess.Popen([*command, *flags], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
    lines, endpoints = [], {}
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while "Press Ctrl-C" not in "".join(lines):
        line = process.stdout.readline()
        assert line, f"chorus up exited early:\n{''.join(lines)}"
        lines.append(line)
        assert time.monotonic() < deadline, "".join(lines)
    text = "".join(lines)
    endpoints["rest"] = re.search(r"REST API\s+(http://\S+)", text).group(1)
    for name in ("gateway", "talker", "vocoder", "diffusion"):
        label = "gRPC API" if name == "gateway" else name
        endpoints[name] = re.search(rf"{label}\s+(127\.0\.0\.1:\d+)", text).group(1)
    endpoints["redis"] = re.search(r"redis\s+(redis://\S+)", text).group(1)
    return process, endpoints


@pytest.fixture
def stack():
    process, endpoints = start_stack()
    yield process, endpoints
    if process.poll() is None:
        process.kill()
        process.wait()


def test_chorus_up_serves_everything_and_stops_cleanly(stack):
    process, endpoints = stack
    ready = httpx.get(endpoints["rest"] + "/ready", timeout=5)
    assert ready.status_code == 200, ready.text
    assert ready.json()["ready"] is True and ready.json()["redis"] is True
    assert httpx.get(endpoints["rest"] + "/health", timeout=5).json() == {"status": "ok"}
    for name in ("talker", "vocoder", "diffusion", "gateway"):
        entry = SERVICES[name]
        with grpc.insecure_channel(endpoints[name]) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=entry.grpc_service), timeout=5
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, name

    # Real requests through the real processes: speech (talker → vocoder) and text-to-audio (diffusion).
    speech_model = httpx.get(endpoints["rest"] + "/v1/models", timeout=10).json()["data"][0]["id"]
    speech = {"model": speech_model, "input": "Hello.", "voice": "ryan", "response_format": "wav", "max_frames": 20}
    reply = httpx.post(endpoints["rest"] + "/v1/audio/speech", json=speech, timeout=60)
    assert reply.status_code == 200 and reply.content[:4] == b"RIFF" and len(reply.content) > 44, reply.text
    generation = {
        "model": "stable-audio-open-1.0",
        "prompt": "rain",
        "duration_s": 0.5,
        "num_steps": 3,
        "response_format": "wav",
    }
    reply = httpx.post(endpoints["rest"] + "/v1/audio/generations", json=generation, timeout=60)
    assert reply.status_code == 200 and reply.content[:4] == b"RIFF" and len(reply.content) > 44, reply.text

    children = descendants(process.pid)
    assert len(children) >= 5  # redis-server + four services
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert "stopped (talker 0, vocoder 0, diffusion 0, gateway 0)" in process.stdout.read()
    time.sleep(0.2)
    assert not [pid for pid in children if is_alive(pid)], "orphans left behind"


def test_a_killed_chorus_up_leaves_no_orphans(stack):
    process, _ = stack
    children = descendants(process.pid)
    process.kill()  # no chance to clean up: the kernel's parent-death signal must do it
    process.wait()
    deadline = time.monotonic() + 20
    while [pid for pid in children if is_alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if is_alive(pid)], "orphans left behind"


def test_chorus_up_with_speech_in_one_process(tmp_path):
    process, endpoints = start_stack("--speech-in-one-process")
    try:
        assert endpoints["talker"] == endpoints["vocoder"], "one process serves both"
        children = descendants(process.pid)
        assert len(children) == 4  # redis-server, speech, diffusion, gateway
        speech = {"model": "tiny", "input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 20}
        reply = httpx.post(endpoints["rest"] + "/v1/audio/speech", json=speech, timeout=60)
        assert reply.status_code == 200 and len(reply.content) > 0, reply.text

        # The bench finds the speech process (and its /metrics port) and the gateway's among these processes.
        bench = [sys.executable, "-m", "chorus.cli", "bench", "tts", "--url", endpoints["rest"], "--grpc-target"]
        bench += [endpoints["gateway"], "--transport", "grpc", "--concurrency", "2", "--requests-per-level", "2"]
        bench += ["--fixed-frames", "8", "--prompts", "short", "--out", str(tmp_path)]
        subprocess.run(bench, check=True, capture_output=True, timeout=120)
        (report,) = tmp_path.glob("e2e-tts-*.json")
        (level,) = json.loads(report.read_text())["levels"]
        steps = level["breakdown"]
        assert steps["speech_processes"] == steps["gateway_processes"] == 1 and "note" not in steps, steps
        assert steps["talker_steps"] >= 8 and steps["talker_mean_batch_size"] >= 1 and steps["talker_prefills"] == 2
        assert steps["vocoder_chunks"] > 0 and steps["vocoder_audio_s"] == pytest.approx(level["audio_s"])
        assert steps["speech_cpu_ms_per_talker_step"] > 0 and steps["gateway_cpu_ms_per_chunk"] > 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        assert "stopped (speech 0, diffusion 0, gateway 0)" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


RECOVERY_TIMEOUT_S = 120  # a restarted talker imports torch and builds its model again on a shared 2-core box


def speech_succeeds(rest: str) -> bool:
    speech = {"model": "tiny", "input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 10}
    try:
        reply = httpx.post(rest + "/v1/audio/speech", json=speech, timeout=30)
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and len(reply.content) > 0


def ready_state(rest: str) -> dict | None:
    """The gateway's /ready body, or None while it does not answer."""
    try:
        return httpx.get(rest + "/ready", timeout=3).json()
    except (httpx.HTTPError, ValueError):
        return None


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


def test_chorus_up_restarts_a_killed_process_and_the_gateway_takes_it_back(tmp_path):
    log = tmp_path / "chorus-up.log"
    process, endpoints = start_stack(stderr_path=log)
    rest = endpoints["rest"]
    try:
        assert speech_succeeds(rest)
        for name, command_part in (("talker", "serve talker"), ("redis", "redis-server"), ("gateway", "serve gateway")):
            killed_at = time.monotonic()
            os.kill(child_pid(process.pid, command_part), signal.SIGKILL)
            if name == "talker":  # the gateway sees the replica go, then takes the restarted one back
                wait_until(lambda: (ready_state(rest) or {}).get("ready") is False, 10, "gateway notices the talker")
                assert not any(ready_state(rest)["backends"]["talker"].values())
            wait_until(lambda: (ready_state(rest) or {}).get("ready") is True, RECOVERY_TIMEOUT_S, f"{name} back")
            wait_until(lambda: speech_succeeds(rest), 30, f"speech after {name} restarted")
            print(f"{name}: SIGKILL to a served speech request again in {time.monotonic() - killed_at:.1f} s")
            lines = log.read_text()
            assert f"chorus up: {name} killed by SIGKILL after" in lines and "; restart 1 in 0.5 s" in lines
            assert f"chorus up: {name} restarted (restart 1, pid " in lines
        wait_until(lambda: "gateway is serving again" in log.read_text(), 10, "recovery line")

        # A stopping `chorus up` restarts nothing, even a child that dies while it stops.
        vocoder = child_pid(process.pid, "serve vocoder")
        children = descendants(process.pid)
        process.send_signal(signal.SIGTERM)
        os.kill(vocoder, signal.SIGKILL)
        assert process.wait(30) == 0
        assert "vocoder restarted" not in log.read_text()
        time.sleep(0.2)
        assert not [pid for pid in children if is_alive(pid)], "orphans left behind"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

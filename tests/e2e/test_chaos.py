"""Chaos: processes killed (SIGKILL) or frozen (SIGSTOP) at random under load, and nothing is lost.

Two gateway processes and two replicas of every backend (tiny CPU models, a real Redis, loopback) serve a
steady mix of streamed speech (raw PCM and MP3), SSE speech and async text-to-audio, every request seeded.
First each request runs undisturbed; then the same requests run again while, every few seconds, a process
chosen at random is killed and restarted a second later, or frozen for a few seconds. Never the last
serving replica of a backend: then every request must end done with exactly the bytes of its undisturbed
run — none failed, hung, cut short, duplicated or different. The test prints its figures.
"""

from __future__ import annotations

import asyncio
import io
import random
import time

import av
import numpy as np
import pytest
import redis
from cluster import Cluster, Outcome, ResumingClient

from chorus.gateway.frame_log import FRAME_BYTES
from chorus.gateway.state import keys

PHASE_S = 45.0  # the faulty phase keeps load on for this long
FAULT_INTERVAL_S = 4.0
STOP_S = 4.0  # how long a frozen process stays frozen
SEED = 20261125
MP3_TOLERANCE_LSB = 64  # wrong audio differs by thousands


def _workload(model: str) -> list[tuple[str, dict]]:
    speech = {
        "model": model,
        "voice": "vivian",
        "input": "Nothing is lost when a process dies.",
        "max_frames": 40,
        "ignore_eos": True,
    }
    requests = []
    for index in range(4):
        requests.append(("speech", speech | {"seed": index, "response_format": "pcm"}))
    requests.append(("speech", speech | {"seed": 10, "response_format": "mp3"}))
    requests.append(("speech", speech | {"seed": 11, "response_format": "pcm", "stream_format": "sse"}))
    generation = {"model": "stable-audio-open-1.0", "prompt": "rain on a tin roof", "duration_s": 0.5, "num_steps": 4}
    requests.append(("generation", generation | {"seed": 7, "response_format": "wav"}))
    return requests


async def _run(client: ResumingClient, kind: str, body: dict) -> Outcome:
    return await (client.speech(body) if kind == "speech" else client.generation(body))


class Faults:
    """Every `interval_s`, kills or freezes one process whose kind keeps another serving replica."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.log: list[tuple[float, str, str]] = []  # (time, action, member)

    async def run(self, until: float) -> None:
        while time.monotonic() + FAULT_INTERVAL_S < until:
            await asyncio.sleep(FAULT_INTERVAL_S)
            candidates = [m for m in self.cluster.members if await self._has_serving_peer(m)]
            if not candidates:
                continue
            member = self.rng.choice(candidates)
            if self.rng.random() < 0.7:
                self.log.append((time.monotonic(), "SIGKILL", member.name))
                await asyncio.to_thread(self.cluster.kill, member)
            else:
                self.log.append((time.monotonic(), "SIGSTOP", member.name))
                self.cluster.stop(member)
                asyncio.get_running_loop().call_later(STOP_S, self.cluster.resume, member)

    async def _has_serving_peer(self, member) -> bool:
        if not await asyncio.to_thread(self.cluster.is_serving, member):
            return False
        peers = [m for m in self.cluster.of(member.kind) if m is not member]
        return any([await asyncio.to_thread(self.cluster.is_serving, peer) for peer in peers])


def _resumed_after(faults: list[tuple[float, str, str]], outcomes: list[Outcome]) -> list[float]:
    """For each fault and each stream in flight at that moment: seconds from the fault to its next audio."""
    gaps = []
    for at, _, _ in faults:
        for outcome in outcomes:
            times = outcome.chunk_times
            if times and times[0] < at < times[-1]:
                gaps.append(next(t for t in times if t > at) - at)
    return gaps


def _samples(data: bytes, response_format: str) -> np.ndarray:
    """s16 samples of a response, decoded."""
    if response_format == "pcm":
        return np.frombuffer(data, "<i2").astype(np.int32)
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
    samples = np.concatenate(frames)
    return np.round(samples * 32768).astype(np.int32) if samples.dtype.kind == "f" else samples.astype(np.int32)


def _max_lsb(outcome: Outcome, expected: Outcome, response_format: str) -> int:
    a, b = _samples(outcome.data, response_format), _samples(expected.data, response_format)
    return int(np.abs(a - b).max()) if len(a) == len(b) and len(a) else 1 << 16


def _codes(redis_url: str, request_id: str) -> list[bytes]:
    """The codec frames the run's talkers made, per segment, as the frame journal holds them."""
    client = redis.Redis.from_url(redis_url)
    segments: dict[int, bytes] = {}
    for _, fields in client.xrange(keys.frames(request_id)):
        segment = int(fields[b"segment"])
        codes = segments.setdefault(segment, b"")
        if b"offset" in fields and int(fields[b"offset"]) * FRAME_BYTES == len(codes):
            segments[segment] = codes + fields[b"codes"]
    client.close()
    return [segments[index] for index in sorted(segments)]


def _difference(outcome: Outcome, expected: Outcome, response_format: str, redis_url: str) -> str | None:
    """How `outcome` differs from the undisturbed run: codec codes must be identical; audio may differ by what
    batching alone changes (float rounding of batched decodes: at most 1 LSB of s16 PCM; the lossy MP3 of such
    input a little more)."""
    if outcome.kind != "audio" and _codes(redis_url, outcome.request_id) != _codes(redis_url, expected.request_id):
        return "codec codes differ"
    tolerance = MP3_TOLERANCE_LSB if response_format == "mp3" else 1
    if (lsb := _max_lsb(outcome, expected, response_format)) > tolerance:
        return f"audio differs by up to {lsb} LSB ({len(outcome.data)} bytes, expected {len(expected.data)})"
    return None


@pytest.fixture
def cluster(redis_url, tmp_path):
    env = {
        "CHORUS_GATEWAY_RECONNECT_GRACE_S": "10",  # a client resuming through the other gateway comes back
        "CHORUS_GATEWAY_HEALTH_INTERVAL_S": "0.5",
        "CHORUS_TALKER_MAX_FRAMES": "400",
    }
    cluster = Cluster(redis_url, tmp_path, {"talker": 2, "vocoder": 2, "diffusion": 2}, gateways=2, env=env)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.mark.timeout(400)
async def test_no_request_is_lost_or_changed_while_processes_die(cluster, redis_url):
    import httpx

    started = time.monotonic()
    model = httpx.get(f"{cluster.gateway_urls[0]}/v1/models").json()["data"][0]["id"]
    workload = _workload(model)
    client = ResumingClient(cluster.gateway_urls, deadline_s=90.0)
    reference = await asyncio.gather(*(_run(client, kind, body) for kind, body in workload))
    for outcome in reference:
        assert outcome.error is None and outcome.data, f"undisturbed run failed: {outcome}"

    # The same requests again and again, a few at once, while processes die.
    rng = random.Random(SEED)
    until = time.monotonic() + PHASE_S
    faults = Faults(cluster, rng)
    outcomes: list[tuple[int, Outcome]] = []

    async def load(lane: int) -> None:
        index = lane
        while time.monotonic() < until:
            kind, body = workload[index % len(workload)]
            outcomes.append((index % len(workload), await _run(client, kind, body)))
            index += 3

    await asyncio.gather(faults.run(until), *(load(lane) for lane in range(3)))

    failed = [(i, o.kind, o.error) for i, o in outcomes if o.error is not None]
    formats = [body["response_format"] for _, body in workload]
    different = [
        (i, o.kind, difference)
        for i, o in outcomes
        if o.error is None and (difference := _difference(o, reference[i], formats[i], redis_url)) is not None
    ]
    max_lsb = max((_max_lsb(o, reference[i], formats[i]) for i, o in outcomes if o.error is None), default=0)
    gaps = _resumed_after(faults.log, [o for _, o in outcomes])
    print(
        f"\nchaos: {len(outcomes)} requests ({sum(o.reconnects for _, o in outcomes)} client reconnects), "
        f"{len(faults.log)} faults ({', '.join(f'{action} {name}' for _, action, name in faults.log)}), "
        f"restarts {sum(m.restarts for m in cluster.members)}; failed {len(failed)}, different {len(different)}; "
        f"fault → next audio of the streams in flight: p50 {np.percentile(gaps, 50) if gaps else 0:.2f} s, "
        f"p95 {np.percentile(gaps, 95) if gaps else 0:.2f} s, max {max(gaps, default=0):.2f} s "
        f"over {len(gaps)} streams; {time.monotonic() - started:.0f} s in all"
    )
    assert len(faults.log) >= 5, "too few faults injected to prove anything"
    print(f"largest audio difference to the undisturbed run: {max_lsb} LSB (s16)")
    print(f"failed: {failed}\ndifferent: {different}")
    assert not failed, f"requests failed: {failed}"
    assert not different, f"requests whose output differs from their undisturbed run: {different}"

"""The fault tests' workload (every request seeded, so each has one right answer) and how an answer is checked
against the same request's undisturbed run: codec codes identical (the frame journal in Redis holds them), audio
the same up to what batching alone changes (float rounding of batched decodes: at most 1 LSB of s16 PCM; the lossy
MP3 of such input a little more; wrong audio differs by thousands)."""

from __future__ import annotations

import asyncio
import io
import time

import av
import httpx
import numpy as np
import redis
from cluster import Cluster, Outcome, ResumingClient
from prometheus_client.parser import text_string_to_metric_families

from chorus.gateway.frame_log import FRAME_BYTES
from chorus.gateway.state import keys
from chorus.gateway.state.frames import assemble

MP3_TOLERANCE_LSB = 64


def workload(model: str) -> list[tuple[str, dict]]:
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


async def run(client: ResumingClient, kind: str, body: dict) -> Outcome:
    return await (client.speech(body) if kind == "speech" else client.generation(body))


def _samples(data: bytes, response_format: str) -> np.ndarray:
    """s16 samples of a response, decoded."""
    if response_format == "pcm":
        return np.frombuffer(data, "<i2").astype(np.int32)
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(audio=0)]
    samples = np.concatenate(frames)
    return np.round(samples * 32768).astype(np.int32) if samples.dtype.kind == "f" else samples.astype(np.int32)


def max_lsb(outcome: Outcome, expected: Outcome, response_format: str) -> int:
    a, b = _samples(outcome.data, response_format), _samples(expected.data, response_format)
    return int(np.abs(a - b).max()) if len(a) == len(b) and len(a) else 1 << 16


def _codes(redis_url: str, request_id: str) -> list[bytes]:
    """The codec frames the run's talkers made, per segment, as the frame journal holds them."""
    client = redis.Redis.from_url(redis_url)
    entries = [fields for _, fields in client.xrange(keys.frames(request_id))]
    client.close()
    num_segments = 1 + max((int(fields[b"segment"]) for fields in entries), default=-1)
    return [segment.codes for segment in assemble(entries, num_segments, FRAME_BYTES)]


def difference(outcome: Outcome, expected: Outcome, response_format: str, redis_url: str) -> str | None:
    """How `outcome` differs from the undisturbed run: codec codes must be identical; audio may differ by what
    batching alone changes (float rounding of batched decodes: at most 1 LSB of s16 PCM; the lossy MP3 of such
    input a little more)."""
    if outcome.kind != "audio":
        codes, expected_codes = _codes(redis_url, outcome.request_id), _codes(redis_url, expected.request_id)
        if codes != expected_codes:
            frames = [[len(segment) // FRAME_BYTES for segment in run] for run in (codes, expected_codes)]
            return f"codec codes differ (frames per segment {frames[0]}, expected {frames[1]})"
    tolerance = MP3_TOLERANCE_LSB if response_format == "mp3" else 1
    if (lsb := max_lsb(outcome, expected, response_format)) > tolerance:
        return f"audio differs by up to {lsb} LSB ({len(outcome.data)} bytes, expected {len(expected.data)})"
    return None


async def references(cluster: Cluster, client: ResumingClient) -> tuple[list[tuple[str, dict]], list[Outcome]]:
    """The workload for the cluster's talker, and each request's undisturbed answer."""
    models = httpx.get(f"{cluster.gateway_urls[0]}/v1/models")
    assert models.status_code == 200, f"GET /v1/models: {models.status_code} {models.text}"
    model = models.json()["data"][0]["id"]
    requests = workload(model)
    answers = await asyncio.gather(*(run(client, kind, body) for kind, body in requests))
    for answer in answers:
        assert answer.error is None and answer.data, f"undisturbed run failed: {answer}"
    return requests, answers


def undisturbed_reconnects(reference: list[Outcome]) -> int:
    """Reconnects of the undisturbed run, which should have none: a client that reconnected got a 5xx or lost its
    connection with no fault injected (a retry of a failed request runs it again, so it still ends with the right
    answer). Printed by the fault tests, not failed on: the gateway's log names the request and why it failed."""
    return sum(answer.reconnects for answer in reference)


def runs_lost(cluster: Cluster) -> int:
    """Runs the gateway processes lost to another process while they still ran them (a lease that lapsed on a live,
    busy process: `chorus_gateway_runs_lost_total`). Printed after the undisturbed run, where no fault explains them:
    on a loaded 2-core machine a gateway's 2 s lease can lapse there, and that run's frames are then journaled by both
    processes (the reason the frame journal reads overlapping chunks)."""
    samples = [
        sample.value
        for url in cluster.gateway_urls
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
        for sample in family.samples
        if sample.name == "chorus_gateway_runs_lost_total"
    ]
    assert len(samples) == len(cluster.gateway_urls), "a gateway's /metrics lacks chorus_gateway_runs_lost_total"
    return int(sum(samples))


async def load(
    client: ResumingClient, requests, until: float, lanes: int = 3, stop: asyncio.Task | None = None
) -> list[tuple[int, Outcome]]:
    """The workload's requests again and again, `lanes` at once, until `until` or `stop` is done (its error
    raised); (workload index, answer) each."""
    answers: list[tuple[int, Outcome]] = []

    async def lane(index: int) -> None:
        while time.monotonic() < until and not (stop is not None and stop.done()):
            kind, body = requests[index % len(requests)]
            answers.append((index % len(requests), await run(client, kind, body)))
            index += lanes

    await asyncio.gather(*(lane(start) for start in range(lanes)))
    if stop is not None:
        await stop
    return answers


def judge(answers, requests, reference: list[Outcome], redis_url: str) -> tuple[list, list, int]:
    """(failed, different, largest audio difference in LSB) of the answers against the undisturbed ones."""
    formats = [body["response_format"] for _, body in requests]
    failed = [(i, o.kind, o.error) for i, o in answers if o.error is not None]
    different = [
        (i, o.kind, why)
        for i, o in answers
        if o.error is None and (why := difference(o, reference[i], formats[i], redis_url)) is not None
    ]
    largest = max((max_lsb(o, reference[i], formats[i]) for i, o in answers if o.error is None), default=0)
    return failed, different, largest

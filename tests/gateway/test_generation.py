"""Text-to-audio end to end: the real gateway in front of real tiny diffusion services, real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time

import av
import grpc
import numpy as np
import pytest

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.rest import create_app
from chorus.gateway.state import keys
from chorus.runtime.host import ServiceHost
from chorus.runtime.processes import free_port
from chorus.v1 import common_pb2, diffusion_pb2, diffusion_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from chorus.wire import chunk_to_pcm

SAMPLE_RATE_HZ = 44_100
NUM_STEPS_TO_WATCH = 100  # long enough for several progress polls
LONG_RUN = {"duration_s": 0.7, "num_steps": 500}  # the tiny model's longest: seconds on CPU, time to cancel it


@contextlib.asynccontextmanager
async def diffusion_replica(port: int = 0):
    config = DiffusionConfig(device="cpu", port=port, metrics_port=-1, grace_s=1.0)
    service = DiffusionService(config)
    host = ServiceHost(config, service)
    await host.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            yield f"127.0.0.1:{host.port}", diffusion_pb2_grpc.DiffusionStub(channel)
    finally:
        await host.stop()


async def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def gateway_with(start_gateway, redis_url, targets, **overrides):
    async with start_gateway(redis_url, diffusion_targets=tuple(targets), **overrides) as (gateway, http, grpc_target):
        replicas = gateway.context.backends.replicas["diffusion"]

        async def all_healthy() -> bool:
            return all(replica.is_healthy and replica.load is not None for replica in replicas)

        await wait_for(all_healthy)
        yield gateway, http, grpc_target


@pytest.fixture
async def replica():
    async with diffusion_replica() as replica:
        yield replica


@pytest.fixture
async def stack(start_gateway, redis_url, replica):
    target, stub = replica
    async with gateway_with(start_gateway, redis_url, [target]) as (gateway, http, grpc_target):
        yield gateway, http, grpc_target, stub


def body(**fields) -> dict:
    return {
        "model": "stable-audio-open-1.0",
        "prompt": "rain on a tin roof",
        "duration_s": 0.5,
        "num_steps": 3,
    } | fields


def decode(data: bytes) -> tuple[int, int, np.ndarray]:
    """(sample rate, channels, (num_samples, channels) float32) of an encoded audio file."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray() for frame in container.decode(stream)]
        rate, channels = stream.rate, stream.channels
    samples = np.concatenate([f.reshape(-1, channels) if f.shape[0] == 1 else f.T for f in frames])
    if np.issubdtype(samples.dtype, np.integer):
        samples = samples / 32768.0
    return rate, channels, samples.astype(np.float32)


async def live_streams(stub) -> int:
    load = await stub.GetLoad(common_pb2.GetLoadRequest())
    return load.live_streams + load.queue_depth


async def test_sync_wav_carries_the_diffusion_services_audio(stack):
    _, http, _, stub = stack
    reply = await http.post("/v1/audio/generations", json=body(response_format="wav", seed=7))
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "audio/wav"
    rate, channels, samples = decode(reply.content)
    assert (rate, channels) == (SAMPLE_RATE_HZ, 2)
    direct = diffusion_pb2.GenerateRequest(prompt="rain on a tin roof", duration_s=0.5, num_steps=3, seed=7)
    outputs = [m async for m in stub.Generate(direct)]
    expected = np.concatenate([chunk_to_pcm(m.audio.pcm) for m in outputs if m.HasField("audio")])
    assert samples.shape == expected.shape
    # wav is int16: equal to the service's float samples up to one quantisation step.
    np.testing.assert_allclose(samples, np.clip(expected, -1, 1), atol=2 / 32768)
    record = (await http.get(f"/v1/requests/{reply.headers['x-request-id']}")).json()
    assert record["status"] == "done" and record["kind"] == "audio"
    assert record["usage"]["num_steps"] == 3 and record["usage"]["audio_s"] == pytest.approx(0.5, abs=1e-3)
    assert record["progress"] == {"step": 3, "num_steps": 3}


TIMELINE = ["arrived", "admitted", "started", "dispatched", "first_step", "engine_done", "encoded", "journaled"]
TIMELINE.append("finished")


async def test_a_finished_request_has_its_timeline_in_order(stack):
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/generations", json=body(response_format="mp3", seed=3))
    assert reply.status_code == 200, reply.text
    record = (await http.get(f"/v1/requests/{reply.headers['x-request-id']}")).json()
    timeline = record["timeline"]
    assert list(timeline) == [f"{stage}_ms" for stage in TIMELINE] and timeline["admitted_ms"] == 0
    assert list(timeline.values()) == sorted(timeline.values())
    service = record["usage"]["timings"]
    assert 0 <= service["queue_ms"] <= service["first_output_ms"] <= service["total_ms"]
    # The service's run lies within the gateway's: stream opened before it began, Final received after it ended.
    assert timeline["engine_done_ms"] - timeline["dispatched_ms"] >= service["total_ms"] - 1


@pytest.mark.parametrize(("response_format", "sent_as"), [("wav", np.int16), ("mp3", np.float32)])
async def test_sync_audio_is_the_services_pcm_encoded_once_off_the_event_loop(
    stack, monkeypatch, response_format, sent_as
):
    """The file is the service's float samples encoded, byte for byte; for a 16-bit file (wav, pcm) the service
    sends them converted to int16 already (half the bytes), which must not change a byte of it."""
    _, http, _, stub = stack
    encoding_threads, encoded_dtypes = [], []
    encode = StreamingEncoder.encode

    def recording_encode(self, samples):
        encoding_threads.append(threading.get_ident())
        encoded_dtypes.append(samples.dtype)
        return encode(self, samples)

    monkeypatch.setattr(StreamingEncoder, "encode", recording_encode)
    reply = await http.post("/v1/audio/generations", json=body(response_format=response_format, seed=4))
    assert reply.status_code == 200, reply.text
    assert encoding_threads and threading.get_ident() not in encoding_threads, "encoded on the event loop"
    assert encoded_dtypes == [sent_as]
    direct = diffusion_pb2.GenerateRequest(prompt="rain on a tin roof", duration_s=0.5, num_steps=3, seed=4)
    outputs = [m async for m in stub.Generate(direct)]
    pcm = np.concatenate([chunk_to_pcm(m.audio.pcm) for m in outputs if m.HasField("audio")])
    encoder = StreamingEncoder(response_format, SAMPLE_RATE_HZ, 2)
    assert reply.content == encode(encoder, pcm) + encoder.flush()


@pytest.mark.parametrize("response_format", ["mp3", "flac", "opus"])
async def test_sync_compressed_formats_decode(stack, response_format):
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/generations", json=body(response_format=response_format, seed=1))
    assert reply.status_code == 200, reply.text
    rate, channels, samples = decode(reply.content)
    assert channels == 2 and rate in (SAMPLE_RATE_HZ, 48_000)
    assert samples.shape[0] / rate == pytest.approx(0.5, abs=0.1)


async def test_async_job_reports_progress_and_its_download_matches_sync(stack):
    _, http, _, _ = stack
    job = body(response_format="wav", seed=5, num_steps=NUM_STEPS_TO_WATCH)
    accepted = await http.post("/v1/audio/generations", json=job | {"mode": "async"})
    assert accepted.status_code == 202, accepted.text
    request_id = accepted.json()["id"]
    assert accepted.headers["location"] == f"/v1/requests/{request_id}"
    events = []
    async with http.stream("GET", f"/v1/requests/{request_id}/events") as stream:
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
            elif line.startswith("data: "):
                events[-1] = (events[-1], json.loads(line.removeprefix("data: ")))
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names[:-1]) <= {"progress"} and "progress" in names
    steps = [data["step"] for name, data in events if name == "progress"]
    assert steps == sorted(steps) and len(steps) > 1
    assert all(data["num_steps"] == NUM_STEPS_TO_WATCH for name, data in events if name == "progress")
    assert events[-1][1]["usage"]["num_steps"] == NUM_STEPS_TO_WATCH
    download = await http.get(f"/v1/requests/{request_id}/audio")
    sync = await http.post("/v1/audio/generations", json=job)
    assert download.status_code == 200 and download.content == sync.content


async def test_cancel_stops_the_diffusion_run(stack):
    _, http, _, stub = stack
    await assert_cancel_stops_a_long_run(stub, runner_http=http, cancel_http=http)


async def assert_cancel_stops_a_long_run(stub, runner_http, cancel_http) -> None:
    # A run lasts seconds here, but a loaded 2-core CI box once let one reach its last step before the cancel
    # landed. Such an attempt proves nothing either way, so the test tries again; a cancel that does not stop
    # the run fails every attempt.
    for attempt in range(1, 4):
        record, cancel_s = await cancel_a_long_run(stub, runner_http, cancel_http)
        print(f"attempt {attempt}: cancelled at step {record['progress']['step']}, service idle after {cancel_s:.2f} s")
        if record["progress"]["step"] < LONG_RUN["num_steps"]:
            assert record["status"] == "cancelled", record
            return
    pytest.fail("every run reached its last step although cancelled: the cancel did not stop the diffusion run")


async def cancel_a_long_run(stub, runner_http, cancel_http) -> tuple[dict, float]:
    """The record of a long run started through `runner_http` and cancelled through `cancel_http` once it made
    progress, and how long the service took to go idle."""
    accepted = await runner_http.post("/v1/audio/generations", json=body(mode="async", **LONG_RUN))
    request_id = accepted.json()["id"]

    async def has_progress() -> bool:
        return (await cancel_http.get(f"/v1/requests/{request_id}")).json()["progress"] is not None

    await wait_for(has_progress)
    started = time.monotonic()
    cancelled = await cancel_http.post(f"/v1/requests/{request_id}/cancel")
    assert cancelled.status_code == 200

    async def is_idle() -> bool:
        return await live_streams(stub) == 0

    await wait_for(is_idle, timeout_s=10.0)  # a run left going ends by itself within that here
    cancel_s = time.monotonic() - started

    async def has_ended() -> bool:  # the service may stop the run before the gateway records its end
        return (await runner_http.get(f"/v1/requests/{request_id}")).json()["status"] != "running"

    await wait_for(has_ended)
    return (await runner_http.get(f"/v1/requests/{request_id}")).json(), cancel_s


async def test_client_disconnect_cancels_the_sync_run(stack):
    gateway, http, _, stub = stack
    headers = {"Idempotency-Key": "left-and-came-back"}
    post = asyncio.create_task(http.post("/v1/audio/generations", json=body(**LONG_RUN), headers=headers))

    async def is_busy() -> bool:
        return await live_streams(stub) > 0

    await wait_for(is_busy)
    post.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await post
    started = time.monotonic()

    async def is_idle() -> bool:
        return await live_streams(stub) == 0

    await wait_for(is_idle, timeout_s=3.0)
    # Disconnect poll (0.25 s) + reconnect grace (0.4 s) + the service noticing the cancel.
    assert time.monotonic() - started < 2.0
    assert gateway.context.admission.backends["diffusion"].num_in_flight == 0

    requests = gateway.context.requests
    left_id = (await requests.client.get(keys.idempotency("", headers["Idempotency-Key"]))).decode()

    async def is_cancelled() -> bool:
        return (await http.get(f"/v1/requests/{left_id}")).json()["status"] == "cancelled"

    await wait_for(is_cancelled)
    retry = await http.post("/v1/audio/generations", json=body(), headers=headers)
    assert retry.status_code == 200, retry.text  # the client came back: it gets audio, not the cancel replayed
    assert retry.headers["x-request-id"] != left_id


async def test_the_follower_of_a_sync_run_ends_before_a_client_gone_is_answered(stack):
    gateway, _, _, _ = stack
    content = json.dumps(body(**LONG_RUN)).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/audio/generations", "raw_path": b"/v1/audio/generations", "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode())],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    messages = iter([{"type": "http.request", "body": content, "more_body": False}])
    replies = []

    async def receive() -> dict:  # the body, then the client is gone
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict) -> None:
        replies.append(message)

    async with asyncio.timeout(10):
        await create_app(gateway.context)(scope, receive, send)  # the gateway's own routes, called as uvicorn does
    assert replies[0]["status"] == 499
    running = [getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks() if not task.done()]
    follower = "create_app.<locals>._output_unless_disconnected.<locals>.collect"
    assert follower not in running, "before the fix the follower was cancelled, not awaited: it outlived the request"


async def test_idempotency_key_returns_the_same_request(stack):
    gateway, http, _, _ = stack
    headers = {"Idempotency-Key": "job-42"}
    first = await http.post("/v1/audio/generations", json=body(mode="async", seed=2), headers=headers)
    again = await http.post("/v1/audio/generations", json=body(mode="async", seed=2), headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"]
    sync_retry = await http.post("/v1/audio/generations", json=body(seed=2), headers=headers)
    assert sync_retry.status_code == 200 and sync_retry.headers["x-request-id"] == first.json()["id"]
    other = await http.post("/v1/audio/generations", json=body(mode="async", seed=2), headers={"Idempotency-Key": "b"})
    assert other.json()["id"] != first.json()["id"]
    requests = gateway.context.requests  # a key lasts as long as its request's record, not a day past it
    assert 0 < await requests.client.ttl(keys.idempotency("", "job-42")) <= requests.ttl_s


async def test_a_retry_of_a_request_that_failed_on_the_servers_side_runs_again(start_gateway, redis_url):
    """The only diffusion replica stops mid-run: the run fails (503, nothing to fail over to). Once a replica is
    back on that address, the same POST with the same Idempotency-Key runs anew and completes; it is not answered
    the failure again (which every retry with that key would get until the key expired)."""
    port = free_port()
    headers = {"Idempotency-Key": "retry-after-503"}
    async with contextlib.AsyncExitStack() as first_replica:
        target, _ = await first_replica.enter_async_context(diffusion_replica(port))
        async with gateway_with(start_gateway, redis_url, [target], replica_wait_s=0.3) as (gateway, http, _):
            accepted = await http.post("/v1/audio/generations", json=body(mode="async", **LONG_RUN), headers=headers)
            failed_id = accepted.json()["id"]

            async def has_progress() -> bool:
                return (await http.get(f"/v1/requests/{failed_id}")).json()["progress"] is not None

            async def has_failed() -> bool:
                return (await http.get(f"/v1/requests/{failed_id}")).json()["status"] == "failed"

            await wait_for(has_progress)
            await first_replica.aclose()
            await wait_for(has_failed)
            async with diffusion_replica(port):
                await wait_for(lambda: _any_healthy(gateway))
                retry = await http.post("/v1/audio/generations", json=body(seed=7), headers=headers)
                assert retry.status_code == 200, retry.text  # before the fix: the failure, replayed (503)
                assert retry.headers["x-request-id"] != failed_id and len(retry.content) > 0
                again = await http.post("/v1/audio/generations", json=body(mode="async", seed=7), headers=headers)
                assert again.json()["id"] == retry.headers["x-request-id"]  # the key names the new request now


async def _any_healthy(gateway) -> bool:
    return any(replica.is_healthy for replica in gateway.context.backends.replicas["diffusion"])


async def test_admission_full_answers_429_with_retry_after(start_gateway, redis_url, replica):
    target, _ = replica
    limits = {"diffusion_max_in_flight": 1, "max_queued": 0}
    async with gateway_with(start_gateway, redis_url, [target], **limits) as (gateway, http, _):
        headers = {"Idempotency-Key": "long-one"}
        running = await http.post("/v1/audio/generations", json=body(mode="async", **LONG_RUN), headers=headers)
        assert running.status_code == 202
        refused = await http.post("/v1/audio/generations", json=body(mode="async"))
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["type"] == "rate_limit_error"
        retry = await http.post("/v1/audio/generations", json=body(mode="async", **LONG_RUN), headers=headers)
        assert retry.status_code == 202 and retry.json()["id"] == running.json()["id"]  # answered while full
        await http.post(f"/v1/requests/{running.json()['id']}/cancel")

        async def is_free() -> bool:
            return gateway.context.admission.backends["diffusion"].num_in_flight == 0

        await wait_for(is_free)
        assert (await http.post("/v1/audio/generations", json=body())).status_code == 200


async def test_requests_go_to_the_least_loaded_replica(start_gateway, redis_url, replica):
    target_a, stub_a = replica
    async with (
        diffusion_replica() as (target_b, stub_b),
        gateway_with(start_gateway, redis_url, [target_a, target_b]) as (_, http, _),
    ):
        ids = []

        async def num_running() -> int:
            return await live_streams(stub_a) + await live_streams(stub_b)

        for _ in range(2):
            ids.append((await http.post("/v1/audio/generations", json=body(mode="async", **LONG_RUN))).json()["id"])

            async def is_running(expected: int = len(ids)) -> bool:
                return await num_running() == expected

            await wait_for(is_running)  # the next pick sees the first run in the replica's load
        assert (await live_streams(stub_a), await live_streams(stub_b)) == (1, 1)
        for request_id in ids:
            await http.post(f"/v1/requests/{request_id}/cancel")


async def test_grpc_generate_streams_id_progress_audio_and_final(stack):
    _, _, grpc_target, _ = stack
    async with grpc.aio.insecure_channel(grpc_target) as channel:
        stub = gateway_pb2_grpc.ChorusStub(channel)
        request = gateway_pb2.TextToAudioRequest(
            model="stable-audio-open-1.0",
            prompt="wind",
            duration_s=0.5,
            num_steps=3,
            seed=9,
            response_format=gateway_pb2.AUDIO_FORMAT_FLAC,
        )
        outputs = [output async for output in stub.Generate(request)]
    kinds = [output.WhichOneof("output") for output in outputs]
    assert kinds[0] == "request_id" and kinds[-1] == "final" and "progress" in kinds and "audio" in kinds
    assert kinds.index("audio") > max(i for i, kind in enumerate(kinds) if kind == "progress")
    final = outputs[-1].final
    assert final.reason == common_pb2.FINISH_REASON_COMPLETE and final.usage.num_steps == 3
    audio = b"".join(output.audio.data for output in outputs if output.HasField("audio"))
    rate, channels, samples = decode(audio)
    assert (rate, channels) == (SAMPLE_RATE_HZ, 2) and samples.shape[0] == round(0.5 * SAMPLE_RATE_HZ)


async def test_backend_rejection_is_a_400_with_the_envelope(stack):
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/generations", json=body(negative_prompt="x" * 100_000))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"


async def test_cancel_on_one_gateway_replica_stops_a_run_on_another(start_gateway, redis_url, replica):
    target, stub = replica
    async with (
        gateway_with(start_gateway, redis_url, [target]) as (_, runner_http, _),
        gateway_with(start_gateway, redis_url, [target]) as (_, other_http, _),
    ):
        await assert_cancel_stops_a_long_run(stub, runner_http=runner_http, cancel_http=other_http)


async def test_unknown_model_is_404(stack):
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/generations", json=body(model="musicgen"))
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"

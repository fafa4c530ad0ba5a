"""Speech orchestration against contract doubles of the talker and vocoder (no real engines).

Pipelining, ordering of segments, journaling, errors and cancellation in both directions.
"""

from __future__ import annotations

import asyncio
import io

import av
import grpc
import numpy as np
import pytest
from gateway_contract_backends import (
    SAMPLE_RATE_HZ,
    SAMPLES_PER_FRAME,
    ContractTalker,
    ContractVocoder,
    FixedReplicas,
    expected_samples,
)
from prometheus_client import REGISTRY

from chorus.gateway.audio.encoder_threads import URGENT_LEAD_S, EncoderThreads
from chorus.gateway.frame_log import FrameLog
from chorus.gateway.runner import RunRegistry
from chorus.gateway.speech_pipeline import synthesize_segment
from chorus.gateway.speech_run import SpeechRun, segment_requests
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import CANCELLED, DONE, FAILED, RequestStore
from chorus.runtime.errors import InvalidRequest, Unavailable
from chorus.v1 import common_pb2, talker_pb2, talker_pb2_grpc, vocoder_pb2_grpc


@pytest.fixture
async def backends():
    talker, vocoder = ContractTalker(), ContractVocoder()
    server = grpc.aio.server()
    talker_pb2_grpc.add_TalkerServicer_to_server(talker, server)
    vocoder_pb2_grpc.add_VocoderServicer_to_server(vocoder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stubs = talker_pb2_grpc.TalkerStub(channel), vocoder_pb2_grpc.VocoderStub(channel)
    yield talker, vocoder, stubs
    await channel.close()
    await server.stop(None)


@pytest.fixture
async def state(redis_url):
    client = open_redis(redis_url)
    requests = RequestStore(client)
    cancels = CancelListener(requests)
    yield requests, OutputJournal(client, requests, block_ms=100), cancels
    await cancels.close()
    await client.aclose()


def request(text: str, request_id: str = "r.0") -> talker_pb2.SynthesisRequest:
    return talker_pb2.SynthesisRequest(request_id=request_id, text=text, speaker="vivian")


async def wait_until(predicate, timeout_s: float = 1.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_first_audio_leaves_before_the_talker_finishes(backends):
    talker, _, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()
    stream = synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), request("Hello world."))
    first = await asyncio.wait_for(anext(stream), timeout=2)  # the talker is still held at its gate
    assert len(first.data) == 2 * SAMPLES_PER_FRAME * 4 and first.format == common_pb2.SAMPLE_FORMAT_PCM_F32LE
    talker.gate.set()
    rest = [chunk async for chunk in stream]
    samples = np.concatenate([np.frombuffer(c.data, "<f4") for c in [first, *rest]])
    assert np.array_equal(samples, expected_samples(["Hello world."]))


async def test_backend_errors_end_the_segment_with_typed_errors(backends):
    talker, _, (talker_stub, vocoder_stub) = backends
    with pytest.raises(InvalidRequest, match="text"):
        _ = [c async for c in synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), request("   "))]
    talker.fail_with = common_pb2.Error(code="INTERNAL", message="CUDA out of memory")
    with pytest.raises(Unavailable, match="out of memory"):
        _ = [c async for c in synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), request("Hello."))]


async def test_stopping_the_consumer_cancels_both_upstream_calls(backends):
    talker, vocoder, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()
    stream = synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), request("A long sentence that keeps going."))
    await anext(stream)
    await stream.aclose()  # the client went away
    await wait_until(lambda: talker.num_cancelled == 1 and vocoder.num_cancelled == 1)


class CancelWhenStopped(FrameLog):
    """A segment's frames that cancel `consumer` as one side of the pipeline stops (`side`: "talker", whose task
    fails the log with its cancel; "vocoder", whose frame sender is cancelled while it waits for frames), that is
    while the segment waits for that side to end."""

    def __init__(self, side: str) -> None:
        super().__init__()
        self.side = side
        self.consumer: asyncio.Task | None = None

    def _stopped(self, side: str) -> None:
        if side == self.side and self.consumer is not None:
            self.consumer.cancel()
            self.consumer = None

    def fail(self, error: BaseException) -> None:
        if isinstance(error, asyncio.CancelledError):
            self._stopped("talker")
        super().fail(error)

    async def wait_beyond(self, num_frames: int) -> int:
        try:
            return await super().wait_beyond(num_frames)
        except asyncio.CancelledError:
            self._stopped("vocoder")
            raise


async def ended_cancelled(task: asyncio.Task, timeout_s: float = 2.0) -> bool:
    """Whether `task` ended cancelled within `timeout_s` (then it is cancelled, if still running)."""
    await asyncio.wait([task], timeout=timeout_s)
    if task.done():
        return task.cancelled()
    task.cancel()
    await asyncio.wait([task], timeout=timeout_s)
    return False


async def test_a_cancel_while_the_segment_stops_its_talker_side_is_not_swallowed(backends):
    talker, _, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()  # the talker holds after its first chunk
    frames = CancelWhenStopped("talker")

    async def consume() -> None:
        text = request("A long sentence that keeps going.")
        stream = synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), text, frames=frames)
        await anext(stream)
        await stream.aclose()  # the consumer stops the segment, which stops its talker side

    frames.consumer = asyncio.create_task(consume())
    assert await ended_cancelled(frames.consumer), "before the fix the segment swallowed it: the consumer went on"


async def test_a_cancel_while_a_failed_vocoder_stream_stops_its_sender_is_not_swallowed(backends):
    talker, vocoder, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()  # the talker holds after its first chunk
    vocoder.drains_first_stream = True  # the segment's first vocoder stream fails after one chunk of audio
    frames = CancelWhenStopped("vocoder")

    async def consume() -> None:
        text = request("A long sentence that keeps going.")
        async for _ in synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), text, frames=frames):
            pass

    frames.consumer = asyncio.create_task(consume())
    assert await ended_cancelled(frames.consumer), "before the fix the stream swallowed it, and the segment failed over"


async def test_the_text_writer_ends_with_the_segment(backends):
    talker, _, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()  # the talker holds after its first chunk
    client_typing = asyncio.Event()

    async def deltas():
        yield " and more"
        client_typing.set()
        try:
            await asyncio.Event().wait()  # the client types on
        finally:
            await asyncio.sleep(0.1)  # a text source takes a moment to close (a client stream's own cleanup)

    text = request("A long sentence that keeps going.")
    text.streaming_text = True
    stream = synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), text, text_deltas=deltas())
    async with asyncio.timeout(5):
        await anext(stream)
        await client_typing.wait()
        await stream.aclose()  # the client went away
    writers = [task for task in asyncio.all_tasks() if task.get_name() == "text-r.0" and not task.done()]
    assert writers == [], "before the fix the writer was cancelled, not awaited: it outlived the segment"


async def test_run_journals_segments_in_order_and_finishes_done(backends, state):
    talker, _, (talker_stub, vocoder_stub) = backends
    talker.delay_s = 0.002
    requests, journal, cancels = state
    text = "First sentence here. Second one! A third, rather longer sentence? Fin."
    record = await requests.create("speech", model="m", response_format="wav")
    segments = segment_requests(record.request_id, request(""), text, max_segment_chars=24)
    assert len(segments) >= 3

    def source(segment, frames):
        return synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), segment, frames=frames)

    run = SpeechRun(requests, journal, cancels, record.request_id, segments, source, "wav", max_concurrent_segments=2)
    assert await run.run() == DONE
    entries = [entry async for entry in journal.read(record.request_id)]
    assert entries[-1].final["status"] == DONE
    with av.open(io.BytesIO(b"".join(e.data for e in entries))) as container:
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    expected = expected_samples([s.text for s in segments])
    assert np.abs(decoded / 32768.0 - expected).max() < 1e-3  # in segment order, no gaps
    finished = await requests.get(record.request_id)
    assert finished.status == DONE and finished.usage["audio_s"] == pytest.approx(len(expected) / SAMPLE_RATE_HZ)
    assert run.time_to_first_audio_s is not None
    assert REGISTRY.get_sample_value("chorus_gateway_real_time_factor_count", {"kind": "speech"}) >= 1


async def test_cancel_from_another_replica_stops_the_run_and_its_calls(backends, state, redis_url):
    talker, vocoder, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()  # the talker hangs after its first chunk, as a long request would
    requests, journal, cancels = state
    record = await requests.create("speech", model="m", response_format="mp3")
    segments = segment_requests(record.request_id, request(""), "Hello there. How are you?", 200)
    run = SpeechRun(
        requests,
        journal,
        cancels,
        record.request_id,
        segments,
        lambda s, frames: synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), s, frames=frames),
        "mp3",
    )
    task = asyncio.create_task(run.run())
    await wait_until(lambda: talker.num_started == 1)

    other_replica = open_redis(redis_url)
    started = asyncio.get_running_loop().time()
    await RequestStore(other_replica).request_cancel(record.request_id)
    assert await asyncio.wait_for(task, timeout=2) == CANCELLED
    assert asyncio.get_running_loop().time() - started < 1.0
    await wait_until(lambda: talker.num_cancelled == 1 and vocoder.num_cancelled == 1)
    assert (await requests.get(record.request_id)).status == CANCELLED
    assert [e async for e in journal.read(record.request_id)][-1].final["status"] == CANCELLED
    await other_replica.aclose()


async def test_failed_segment_fails_the_request_with_its_message(backends, state):
    talker, _, (talker_stub, vocoder_stub) = backends
    talker.fail_with = common_pb2.Error(code="INTERNAL", message="talker crashed")
    requests, journal, cancels = state
    record = await requests.create("speech", model="m", response_format="pcm")
    segments = segment_requests(record.request_id, request(""), "Hello.", 200)
    run = SpeechRun(
        requests,
        journal,
        cancels,
        record.request_id,
        segments,
        lambda s, frames: synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), s, frames=frames),
        "pcm",
    )
    assert await run.run() == FAILED
    finished = await requests.get(record.request_id)
    assert finished.error["code"] == "UNAVAILABLE" and "talker crashed" in finished.error["message"]


async def test_runner_cancels_a_run_without_readers_after_the_grace(backends, state):
    talker, vocoder, (talker_stub, vocoder_stub) = backends
    talker.gate = asyncio.Event()
    requests, journal, cancels = state
    runner = RunRegistry(journal, detach_grace_s=0.2)
    record = await requests.create("speech", model="m", response_format="mp3")
    segments = segment_requests(record.request_id, request(""), "Hello there.", 200)
    run = SpeechRun(
        requests,
        journal,
        cancels,
        record.request_id,
        segments,
        lambda s, frames: synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), s, frames=frames),
        "mp3",
    )
    task = runner.start(run)
    with runner.reading(record.request_id):
        await wait_until(lambda: talker.num_started == 1)
    with runner.reading(record.request_id):  # a reconnect within the grace keeps it alive
        await asyncio.sleep(0.3)
        assert not task.done()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout=1.0)
    assert task.cancelled()
    await wait_until(lambda: talker.num_cancelled == 1 and vocoder.num_cancelled == 1)
    assert (await requests.get(record.request_id)).status == CANCELLED
    await runner.close()


class OrderRecordingThreads(EncoderThreads):
    """The gateway's encoder pool, noting the order each call was submitted with (None: a plain `submit`)."""

    def __init__(self) -> None:
        super().__init__(1)
        self.orders = []

    def submit(self, fn, /, *args, **kwargs):
        self.orders.append(None)
        return super().submit(fn, *args, **kwargs)

    def submit_ordered(self, order, fn, /, *args, **kwargs):
        self.orders.append(order)
        return super().submit_ordered(order, fn, *args, **kwargs)


async def test_a_runs_encodes_go_to_the_pool_ordered_by_its_listener_and_start(backends, state):
    _, _, (talker_stub, vocoder_stub) = backends
    requests, journal, cancels = state
    record = await requests.create("speech", model="m", response_format="mp3")
    segments = segment_requests(record.request_id, request(""), "Hello there. How are you today?", 200)
    threads = OrderRecordingThreads()

    def source(segment, frames):
        return synthesize_segment(FixedReplicas(talker_stub, vocoder_stub), segment, frames=frames)

    run = SpeechRun(requests, journal, cancels, record.request_id, segments, source, "mp3", encoder_threads=threads)
    try:
        assert await run.run() == DONE
    finally:
        threads.shutdown()
    # Urgent while under a second ahead of its listener (before its first audio with no lead), then by its start:
    # the contract vocoder is far faster than real time.
    assert threads.orders[0] == (0, 0.0) and None not in threads.orders
    urgent = [lead for kind, lead in threads.orders if kind == 0]
    later = {started for kind, started in threads.orders if kind == 1}
    assert urgent == sorted(urgent) and max(urgent) < URGENT_LEAD_S
    assert len(later) == 1 and threads.orders[len(urgent) :] == [(1, *later)] * (len(threads.orders) - len(urgent))

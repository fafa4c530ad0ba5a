"""`chorus serve speech`: talker and vocoder in one process serve the gateway like two; same audio, and the
ignore_eos benchmark extension runs every request to max_frames. A talker stream that asks for `decode` carries
the audio of its frames too (the gateway's `one_stream_speech`): the same frames and audio as two streams, and a
fail-over's stream goes on from the audio delivered."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from chorus.gateway.backends import BackendPool
from chorus.gateway.frame_log import FrameLog
from chorus.gateway.speech_pipeline import synthesize_segment
from chorus.runtime.host import ServiceHost
from chorus.speech import SpeechConfig, SpeechService
from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService
from chorus.v1 import common_pb2, talker_pb2, talker_pb2_grpc
from chorus.wire import chunk_to_codes, chunk_to_pcm

SAMPLE_RATE_HZ = 24_000
SAMPLES_PER_FRAME = 1920
NUM_FRAMES = 30


@pytest.fixture
async def speech_target(tmp_path, monkeypatch):
    """host:port of a running `chorus serve speech` (tiny models, CPU fp32)."""
    for name, value in {
        "CHORUS_TALKER_DEVICE": "cpu", "CHORUS_TALKER_MAX_STREAMS": "4", "CHORUS_TALKER_CHUNK_FRAMES": "4",
        "CHORUS_TALKER_MAX_FRAMES": "40", "CHORUS_TALKER_CACHE_DIR": str(tmp_path),
        "CHORUS_VOCODER_DEVICE": "cpu", "CHORUS_VOCODER_MAX_STREAMS": "4",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    config = SpeechConfig(metrics_port=-1, grace_s=1.0)
    host = ServiceHost(config, SpeechService(config))
    await host.start()
    try:
        yield f"127.0.0.1:{host.port}"
    finally:
        await host.stop()


@pytest.fixture
async def one_process(start_gateway, redis_url, speech_target):
    target = speech_target
    async with start_gateway(redis_url, talker_targets=(target,), vocoder_targets=(target,)) as (gateway, http, _):
        replicas = gateway.context.backends.replicas
        for _ in range(200):
            if all(replicas[kind][0].is_healthy for kind in ("talker", "vocoder")):
                break
            await asyncio.sleep(0.05)
        yield http


def segment(request_id: str) -> talker_pb2.SynthesisRequest:
    return talker_pb2.SynthesisRequest(
        request_id=request_id, text="One stream carries it all.", speaker="ryan", seed=11,
        max_frames=NUM_FRAMES, ignore_eos=True,
    )  # fmt: skip


async def healthy_pool(targets: dict[str, tuple[str, ...]]) -> BackendPool:
    pool = BackendPool(targets, interval_s=0.1)
    pool.start()
    for _ in range(200):
        if all(replica.is_healthy for found in pool.replicas.values() for replica in found):
            return pool
        await asyncio.sleep(0.05)
    await pool.close()
    raise AssertionError("the speech process never reported healthy")


async def segment_audio(pool: BackendPool, request_id: str, one_stream: bool) -> tuple[bytes, np.ndarray]:
    frames = FrameLog()
    pieces = [
        chunk_to_pcm(pcm).reshape(-1)
        async for pcm in synthesize_segment(pool, segment(request_id), frames=frames, one_stream=one_stream)
    ]
    assert frames.is_finished
    return frames.chunk(0).codes, np.concatenate(pieces)


async def test_one_stream_gives_the_frames_and_audio_of_two(speech_target):
    two = await healthy_pool({"talker": (speech_target,), "vocoder": (speech_target,)})
    one = await healthy_pool({"talker": (speech_target,)})  # no vocoder replica: a vocoder stream would fail
    try:
        frames_two, audio_two = await segment_audio(two, "two-streams", one_stream=False)
        frames_one, audio_one = await segment_audio(one, "one-stream", one_stream=True)
    finally:
        await two.close()
        await one.close()
    assert len(frames_one) == len(frames_two) == NUM_FRAMES * 16 * 2 and frames_one == frames_two
    assert audio_one.shape == audio_two.shape == (NUM_FRAMES * SAMPLES_PER_FRAME,)
    assert np.abs(audio_one - audio_two).max() <= 1e-5


async def decoded(stub, request: talker_pb2.SynthesisRequest) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(frames, audio, the order of the outputs' kinds) of one talker stream that asks for `decode`."""
    frames, audio, kinds = [], [], []
    async for output in stub.Synthesize(iter([talker_pb2.SynthesizeInput(request=request)])):
        kinds.append(output.WhichOneof("output"))
        if output.HasField("chunk"):
            frames.append(chunk_to_codes(output.chunk))
        elif output.HasField("pcm"):
            audio.append(chunk_to_pcm(output.pcm).reshape(-1))
    empty = np.zeros((0, 16), dtype=np.int64)
    return (np.concatenate(frames) if frames else empty), np.concatenate(audio), kinds


async def test_a_fail_over_stream_goes_on_from_the_audio_delivered(speech_target):
    """What the gateway sends another replica when one breaks: the frames made so far, of which some had their
    audio delivered. The new stream's frames and audio are the rest of the undisturbed stream's."""
    async with grpc.aio.insecure_channel(speech_target) as channel:
        stub = talker_pb2_grpc.TalkerStub(channel)
        whole = segment("whole")
        whole.decode.format = common_pb2.SAMPLE_FORMAT_PCM_F32LE
        frames, audio, kinds = await decoded(stub, whole)
        assert kinds[0] == "chunk" and kinds[-1] == "final" and "pcm" in kinds
        assert frames.shape == (NUM_FRAMES, 16) and audio.shape == (NUM_FRAMES * SAMPLES_PER_FRAME,)

        made, delivered = 13, 6  # frames the broken stream made; those whose audio reached the client
        resumed = segment("whole~1")
        resumed.CopyFrom(whole)
        resumed.request_id = "whole~1"
        resumed.prefix_frames.CopyFrom(common_pb2.CodecChunk(
            codes=frames[:made].astype(np.int16).tobytes(), num_frames=made, num_codebooks=16
        ))  # fmt: skip
        resumed.decode.num_delivered_frames = delivered
        rest_frames, rest_audio, _ = await decoded(stub, resumed)
        np.testing.assert_array_equal(rest_frames, frames[made:])
        assert rest_audio.shape == ((NUM_FRAMES - delivered) * SAMPLES_PER_FRAME,)
        assert np.abs(rest_audio - audio[delivered * SAMPLES_PER_FRAME :]).max() <= 1e-5

        resumed.decode.num_delivered_frames = made + 1
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await decoded(stub, resumed)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "decode.num_delivered_frames" in refused.value.details()


async def test_a_talker_without_a_vocoder_beside_it_refuses_decode(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORUS_TALKER_CACHE_DIR", str(tmp_path))
    config = TalkerConfig(device="cpu", max_streams=2, metrics_port=-1, grace_s=1.0)
    host = ServiceHost(config, TalkerService(config))
    await host.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            request = segment("alone")
            request.decode.format = common_pb2.SAMPLE_FORMAT_PCM_F32LE
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await decoded(talker_pb2_grpc.TalkerStub(channel), request)
    finally:
        await host.stop()
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "chorus serve speech" in refused.value.details()


async def test_speech_through_one_process_and_ignore_eos_runs_to_max_frames(one_process):
    http = one_process
    body = {"model": "tiny", "input": "Hello there.", "voice": "ryan", "seed": 3, "response_format": "pcm"}
    reply = await http.post("/v1/audio/speech", json=body | {"max_frames": 17, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert len(reply.content) == 17 * SAMPLES_PER_FRAME * 2, "exactly max_frames of 16-bit audio"
    natural = await http.post("/v1/audio/speech", json=body | {"max_frames": 17})
    assert len(natural.content) <= len(reply.content)
    missing = await http.post("/v1/audio/speech", json=body | {"ignore_eos": True})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "ignore_eos"


def test_bad_component_settings_exit_with_a_message(monkeypatch):
    monkeypatch.setenv("CHORUS_TALKER_MAX_STREAMS", "many")
    with pytest.raises(SystemExit, match=r"chorus serve speech: .*CHORUS_TALKER_MAX_STREAMS"):
        SpeechService(SpeechConfig())


async def test_a_gateway_with_one_stream_speech_answers_as_with_two(start_gateway, redis_url, speech_target):
    body = {"model": "tiny", "input": "Hello there. And again.", "voice": "ryan", "seed": 5, "response_format": "pcm"}
    replies = []
    for one_stream in (False, True):
        targets = {"talker_targets": (speech_target,), "vocoder_targets": (speech_target,)}
        async with start_gateway(redis_url, one_stream_speech=one_stream, **targets) as (gateway, http, _):
            replicas = gateway.context.backends.replicas
            for _ in range(200):
                if all(replicas[kind][0].is_healthy for kind in ("talker", "vocoder")):
                    break
                await asyncio.sleep(0.05)
            reply = await http.post("/v1/audio/speech", json=body | {"max_frames": 17, "ignore_eos": True})
            assert reply.status_code == 200, reply.text
            replies.append(np.frombuffer(reply.content, dtype=np.int16).astype(np.int32))
    two, one = replies
    assert two.shape == one.shape and len(two) >= 17 * SAMPLES_PER_FRAME  # each segment 17 frames
    assert np.abs(two - one).max() <= 1, "the same audio, to the last bit of 16-bit rounding"

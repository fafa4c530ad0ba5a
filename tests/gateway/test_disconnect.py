"""A client that goes away mid-stream frees the backends: REST (closing the connection) and the public
gRPC API (cancelling Speak / SpeakStream) cancel the request's talker and vocoder streams, and both
services report no live stream within one second."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from speech_stack import speech_stack

from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, talker_pb2_grpc, vocoder_pb2_grpc

NUM_FRAMES = 500  # 40 s of audio: far longer than each test keeps the stream
MAX_RELEASE_S = 1.0


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    async with speech_stack(start_gateway, redis_url, str(tmp_path), {"max_frames": NUM_FRAMES}) as stack:
        gateway, http, target, talker_target, vocoder_target = stack
        async with (
            grpc.aio.insecure_channel(talker_target) as talker,
            grpc.aio.insecure_channel(vocoder_target) as vocoder,
        ):
            loads = (talker_pb2_grpc.TalkerStub(talker), vocoder_pb2_grpc.VocoderStub(vocoder))
            yield gateway, http, target, loads


async def live_streams(loads) -> tuple[int, int]:
    replies = [await stub.GetLoad(common_pb2.GetLoadRequest()) for stub in loads]
    return replies[0].live_streams, replies[1].live_streams


async def seconds_until_released(loads) -> float:
    """Seconds until neither the talker nor the vocoder reports a live stream (from the call)."""
    started = time.monotonic()
    while await live_streams(loads) != (0, 0):
        if time.monotonic() - started > 5:
            raise AssertionError(f"backends still busy: {await live_streams(loads)}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def speak_request() -> gateway_pb2.SpeakRequest:
    return gateway_pb2.SpeakRequest(
        model="tiny", input="Hello there.", voice="ryan", language="english", seed=3, max_frames=NUM_FRAMES,
        ignore_eos=True, response_format=gateway_pb2.AUDIO_FORMAT_PCM,
    )  # fmt: skip


async def test_a_rest_client_that_disconnects_frees_the_talker_and_vocoder(stack):
    _, http, _, loads = stack
    body = {"model": "tiny", "input": "Hello there.", "voice": "ryan", "language": "english", "seed": 3}
    body |= {"response_format": "pcm", "max_frames": NUM_FRAMES, "ignore_eos": True}
    async with http.stream("POST", "/v1/audio/speech", json=body) as reply:
        request_id = reply.headers["x-request-id"]
        async for _ in reply.aiter_raw():
            break
        assert await live_streams(loads) == (1, 1)  # mid-stream
    assert await seconds_until_released(loads) <= MAX_RELEASE_S
    record = (await http.get(f"/v1/requests/{request_id}")).json()
    assert record["status"] == "cancelled"


@pytest.mark.parametrize("method", ["Speak", "SpeakStream"])
async def test_a_grpc_client_that_cancels_frees_the_talker_and_vocoder(stack, method):
    _, http, target, loads = stack
    async with grpc.aio.insecure_channel(target) as channel:
        stub = gateway_pb2_grpc.ChorusStub(channel)
        if method == "Speak":
            call = stub.Speak(speak_request())
        else:
            call = stub.SpeakStream(iter([gateway_pb2.SpeakInput(request=speak_request())]))
        request_id = (await call.read()).request_id
        assert (await call.read()).HasField("audio")
        assert await live_streams(loads) == (1, 1)
        call.cancel()
        assert await seconds_until_released(loads) <= MAX_RELEASE_S
    record = (await http.get(f"/v1/requests/{request_id}")).json()
    assert record["status"] == "cancelled"

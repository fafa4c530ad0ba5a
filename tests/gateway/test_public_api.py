"""The public gRPC API: same auth, validation and status codes as REST, over a real channel."""

from __future__ import annotations

import time

import grpc
import pytest

from chorus.gateway.state.auth import hash_key
from chorus.gateway.state.requests import CANCELLED, RUNNING
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, talker_pb2

KEY = "grpc-key"
AUTH = (("authorization", f"Bearer {KEY}"),)


def speak(**changes) -> gateway_pb2.SpeakRequest:
    return gateway_pb2.SpeakRequest(**({"model": "qwen3-tts", "input": "Hello there.", "voice": "vivian"} | changes))


BAD_SPEAK = [
    (speak(input=""), "input"),
    (speak(input="x" * 201), "input"),
    (speak(speed=5.0), "speed"),
    (speak(response_format=99), "response_format"),
    (speak(task_type=42), "task_type"),
    (speak(sampling=talker_pb2.SamplingParams(top_p=1.5)), "sampling.top_p"),
    (speak(x_vector_only=True), "x_vector_only"),
    (speak(ref_audio=b"definitely not audio" * 50), "ref_audio"),
    (speak(model=""), "model"),
]


async def expect_code(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        result = await call if not hasattr(call, "__aiter__") else [item async for item in call]
        raise AssertionError(f"call succeeded: {result}")
    assert failure.value.code() == code, failure.value.details()
    return failure.value.details()


async def test_bad_requests_are_invalid_argument_naming_the_field(start_gateway, redis_url):
    async with (
        start_gateway(redis_url, api_keys=(KEY,), max_input_chars=200) as (_, _, target),
        grpc.aio.insecure_channel(target) as channel,
    ):
        stub = gateway_pb2_grpc.ChorusStub(channel)
        for request, param in BAD_SPEAK:
            details = await expect_code(stub.Speak(request, metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT)
            assert details.startswith(param), (param, details)
        bad_generation = gateway_pb2.TextToAudioRequest(model="sao", prompt="rain", duration_s=60)
        details = await expect_code(stub.Generate(bad_generation, metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT)
        assert details.startswith("duration_s")

        async def text_first():
            yield gateway_pb2.SpeakInput(text_delta="Hello")

        details = await expect_code(stub.SpeakStream(text_first(), metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT)
        assert "SpeakRequest" in details


async def test_auth_backends_and_rate_limits_map_to_grpc_codes(start_gateway, redis_url):
    key = f"key-{time.monotonic_ns()}"
    auth = (("authorization", f"Bearer {key}"),)
    async with (
        start_gateway(redis_url, api_keys=(key,), rate_limit_per_s=0.2, rate_limit_burst=3) as (_, _, target),
        grpc.aio.insecure_channel(target) as channel,
    ):
        stub = gateway_pb2_grpc.ChorusStub(channel)
        await expect_code(stub.Speak(speak()), grpc.StatusCode.UNAUTHENTICATED)
        await expect_code(
            stub.Speak(speak(), metadata=(("authorization", "Bearer nope"),)), grpc.StatusCode.UNAUTHENTICATED
        )
        details = await expect_code(stub.Speak(speak(), metadata=auth), grpc.StatusCode.UNAVAILABLE)
        assert "talker" in details
        generation = gateway_pb2.TextToAudioRequest(model="sao", prompt="rain on a tin roof")
        await expect_code(stub.Generate(generation, metadata=auth), grpc.StatusCode.UNAVAILABLE)
        await expect_code(stub.ListVoices(gateway_pb2.VoiceListRequest(), metadata=auth), grpc.StatusCode.UNAVAILABLE)
        await expect_code(stub.Speak(speak(), metadata=auth), grpc.StatusCode.RESOURCE_EXHAUSTED)


async def test_get_request_and_cancel(start_gateway, redis_url):
    async with start_gateway(redis_url, api_keys=(KEY, "someone-else")) as (gateway, _, target):
        requests = gateway.context.requests
        record = await requests.create("speech", model="qwen3-tts", voice="vivian", owner=hash_key(KEY)[:12])
        await requests.transition(record.request_id, RUNNING)
        async with grpc.aio.insecure_channel(target) as channel:
            stub = gateway_pb2_grpc.ChorusStub(channel)
            ref = gateway_pb2.RequestRef(request_id=record.request_id)
            status = await stub.GetRequest(ref, metadata=AUTH)
            assert (status.state, status.voice, status.kind) == (gateway_pb2.REQUEST_STATE_RUNNING, "vivian", "speech")
            assert status.started_at_s >= status.created_at_s > 0
            stranger = (("authorization", "Bearer someone-else"),)
            await expect_code(stub.GetRequest(ref, metadata=stranger), grpc.StatusCode.NOT_FOUND)
            await expect_code(stub.Cancel(ref, metadata=stranger), grpc.StatusCode.NOT_FOUND)

            status = await stub.Cancel(ref, metadata=AUTH)
            assert status.state == gateway_pb2.REQUEST_STATE_RUNNING  # the replica running it finishes the cancel
            assert await requests.is_cancel_requested(record.request_id)
            await requests.transition(record.request_id, CANCELLED, usage={"audio_s": 0.5, "num_frames": 6})
            status = await stub.GetRequest(ref, metadata=AUTH)
            assert status.state == gateway_pb2.REQUEST_STATE_CANCELLED
            assert status.usage == common_pb2.Usage(audio_s=0.5, num_frames=6)
            await expect_code(
                stub.GetRequest(gateway_pb2.RequestRef(request_id="nope"), metadata=AUTH), grpc.StatusCode.NOT_FOUND
            )

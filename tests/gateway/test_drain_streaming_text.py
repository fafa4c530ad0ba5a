"""A streaming-text speech request admitted once the drain began: its text streams in over this process's
connection, so no other process can run it, and it is refused with the drain's retryable UNAVAILABLE, leaving
nothing in Redis (the real gateway, tiny talker and vocoder, redis-server). Other requests go to the other
processes instead: tests/gateway/test_run_broker.py."""

from __future__ import annotations

import asyncio

import grpc
from speech_stack import speech_stack
from test_public_api import expect_code

from chorus.gateway.jobs import DRAINING
from chorus.gateway.state import keys
from chorus.v1 import gateway_pb2, gateway_pb2_grpc

RECORDS = keys.record("*")


async def test_a_streaming_text_request_that_waited_for_its_slot_past_the_drain_is_refused(
    start_gateway, redis_url, tmp_path
):
    config = dict(talker_max_in_flight=1, vocoder_max_in_flight=1)
    async with (
        speech_stack(start_gateway, redis_url, str(tmp_path), **config) as (gateway, _, target, _, _),
        grpc.aio.insecure_channel(target) as channel,
        asyncio.timeout(20),
    ):
        ctx = gateway.context
        redis = ctx.broker.queue.client
        records_before = {key async for key in redis.scan_iter(match=RECORDS)}
        first = gateway_pb2.SpeakRequest(model="tiny", input="Hello", voice="ryan", language="english", max_frames=30)
        messages = [
            gateway_pb2.SpeakInput(request=first),
            gateway_pb2.SpeakInput(text_delta=" there."),
            gateway_pb2.SpeakInput(end_of_input=True),
        ]
        talker = ctx.admission.backends["talker"]
        async with ctx.admission.enter("talker", "vocoder"):  # the one slot is busy: the request waits for it
            # Not refused, it would follow a journal that nobody here or elsewhere writes: the deadline ends it.
            call = gateway_pb2_grpc.ChorusStub(channel).SpeakStream(iter(messages), timeout=5)
            refused = asyncio.create_task(expect_code(call, grpc.StatusCode.UNAVAILABLE))
            while talker.queue_depth == 0:
                await asyncio.sleep(0.01)
            await gateway.drain()  # SIGTERM's hand-over
        assert await refused == DRAINING
        # Refused before its record and run were made, and its slot is free again.
        assert {key async for key in redis.scan_iter(match=RECORDS)} == records_before
        assert await redis.xlen(ctx.broker.queue.stream) == 0
        assert (talker.num_in_flight, ctx.admission.backends["vocoder"].num_in_flight) == (0, 0)

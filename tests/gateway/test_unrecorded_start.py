"""A run that could not record its start (Redis failed that once) is not over: it is run again, and the client that
started it gets the whole answer, the same bytes as an undisturbed run, instead of waiting forever for a run that
nobody runs. (CI once saw that wait: a transient Redis error at a run's start left its SSE client with no reply
for 60 s.) The real gateway in front of the real tiny talker and vocoder, real Redis; the one failed Redis command
is injected, the rest is real."""

from __future__ import annotations

import logging
import time

import pytest
from speech_stack import speech_stack

from chorus.gateway.state.requests import RUNNING
from chorus.runtime.errors import Unavailable


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (gateway, http, *_):
        yield gateway, http


def speech(seed: int) -> dict:
    return {"model": "tiny", "input": "Nothing is lost.", "voice": "ryan", "seed": seed, "language": "english",
            "max_frames": 20, "ignore_eos": True, "response_format": "pcm"}  # fmt: skip


async def test_a_run_whose_start_redis_failed_to_record_is_run_again_with_the_same_output(stack, caplog):
    gateway, http = stack
    requests = gateway.context.requests
    undisturbed = await http.post("/v1/audio/speech", json=speech(seed=5))
    assert undisturbed.status_code == 200 and undisturbed.content

    transition, failed = requests.transition, []

    async def failing_once(request_id, status, *args, **kwargs):
        if status == RUNNING and not failed:
            failed.append(request_id)
            raise Unavailable("request state store (Redis) is unavailable while updating a request")
        return await transition(request_id, status, *args, **kwargs)

    requests.transition = failing_once
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="chorus.gateway.run"):
        reply = await http.post("/v1/audio/speech", json=speech(seed=5), timeout=30)
    waited_s = time.monotonic() - started
    assert failed, "the run's start was the one Redis command that failed"
    assert reply.status_code == 200, reply.text
    assert reply.content == undisturbed.content, "the run again made the undisturbed run's bytes"
    assert any("to be run again" in record.getMessage() for record in caplog.records)
    record = (await http.get(f"/v1/requests/{reply.headers['x-request-id']}")).json()
    assert record["status"] == "done", record
    print(f"run again after its start went unrecorded: whole answer in {waited_s:.2f} s")

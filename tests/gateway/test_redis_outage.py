"""A Redis outage under a running gateway (real tiny talker and vocoder, a redis-server this test owns):
fast 503s in the OpenAI envelope while it lasts, and the same gateway serving again, by itself, once Redis is back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import httpx
import pytest
from redis_servers import cancel_wake_s
from speech_stack import speech_stack

from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.runs import RunQueue, consumer_name
from chorus.runtime.redis_server import start_local_redis

#: A stopped Redis costs a command its socket timeout (2 s); a dead one, a refused connection (at once). The
#: rest is slack for a loaded 2-core test machine (2.05 s measured on a quiet one, 2.5 s on a busy one).
MAX_OUTAGE_ANSWER_S = 3.5
SPEECH = {"model": "tiny", "input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 10}


@pytest.fixture
def own_redis(tmp_path):
    server = start_local_redis(tmp_path / "redis")
    yield server
    if server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
    server.stop()


async def speak(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/audio/speech", json=SPEECH)


async def assert_fast_503(http: httpx.AsyncClient, what: str) -> float:
    """A speech request and a status read both answer 503 in the OpenAI envelope, fast; returns the slower time."""
    slowest_s = 0.0
    for send in (lambda: speak(http), lambda: http.get("/v1/requests/no-such-request")):
        started = time.monotonic()
        reply = await send()
        elapsed_s = time.monotonic() - started
        assert reply.status_code == 503, (what, reply.status_code, reply.text)
        error = reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "server_error" and error["code"] == "unavailable" and "Redis" in error["message"]
        assert reply.headers["retry-after"] == "1"
        assert elapsed_s < MAX_OUTAGE_ANSWER_S, f"{what}: 503 took {elapsed_s:.2f} s"
        slowest_s = max(slowest_s, elapsed_s)
    ready = await http.get("/ready")
    assert ready.status_code == 503 and ready.json()["redis"] is False
    assert (await http.get("/health")).status_code == 200, "an outage of Redis is no reason to restart a gateway"
    return slowest_s


async def test_a_stopped_redis_gives_fast_503s_and_the_gateway_serves_again_when_it_continues(
    start_gateway, own_redis, tmp_path
):
    async with speech_stack(start_gateway, own_redis.url, str(tmp_path)) as (_, http, *_):
        assert (await speak(http)).status_code == 200
        os.kill(own_redis.process.pid, signal.SIGSTOP)  # hung, not gone: connections stay open, nothing answers
        try:
            slowest_s = await assert_fast_503(http, "stopped Redis")
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        started = time.monotonic()
        reply = await speak(http)
        assert reply.status_code == 200 and len(reply.content) > 0, reply.text
        assert (await http.get("/ready")).json()["redis"] is True
        print(f"stopped Redis: 503 within {slowest_s:.2f} s; served again {time.monotonic() - started:.2f} s after")


async def test_a_restarted_redis_is_used_again_cancel_subscription_included(start_gateway, own_redis, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="chorus.gateway.cancel")
    async with speech_stack(start_gateway, own_redis.url, str(tmp_path)) as (gateway, http, *_):
        context = gateway.context
        assert (await speak(http)).status_code == 200
        with context.cancels.watch("held-across-the-outage"):  # the cancel listener is subscribed now
            await asyncio.sleep(0.2)
            own_redis.process.kill()
            own_redis.process.wait()
            slowest_s = await assert_fast_503(http, "dead Redis")
            await asyncio.sleep(1.0)  # the listener notices and keeps retrying
            own_redis.stop()  # lets go of the data directory's lock
            restarted = start_local_redis(tmp_path / "redis", port=own_redis.port)  # on the same port
            own_redis.process, own_redis.lock = restarted.process, restarted.lock

        started = time.monotonic()
        reply = await speak(http)
        assert reply.status_code == 200 and len(reply.content) > 0, reply.text
        served_s = time.monotonic() - started

        wake_s = await cancel_wake_s(context, own_redis.url, caplog)
        assert wake_s < 1.0, f"the cancel took {wake_s:.2f} s: the pub/sub hint did not arrive"
        lost = [r for r in caplog.records if "cancel subscription lost" in r.getMessage()]
        assert len(lost) == 1, "one warning per outage, not one per retry"
        print(f"dead Redis: 503 within {slowest_s:.2f} s; speech served {served_s:.2f} s after the restart")
        print(f"cancel via pub/sub after the restart woke its run in {wake_s * 1000:.0f} ms")


async def test_the_run_queue_survives_a_redis_that_lost_its_data(own_redis):
    """A Redis restarted without persistence has no runs stream and no consumer group: the next run recreates
    both and is this process's at once, with no stray entry left to be taken over later as a ghost run."""
    client = open_redis(own_redis.url)
    queue = RunQueue(client, consumer_name(), lease_s=2.0)
    try:
        await queue.admit({"request_id": "before", "status": "queued"}, b"spec", 60, None)
        await client.flushall()  # what a restart of a Redis without persistence leaves
        _, entry_id = await queue.admit({"request_id": "after", "status": "queued"}, b"spec", 60, None)
        assert await client.xlen(queue.stream) == 1
        assert await queue.heartbeat() == {entry_id}
    finally:
        await client.aclose()

"""The gateway on a Sentinel-managed Redis (real master, replica and Sentinel on loopback): it finds the master
through the Sentinel, serves speech, answers fast 503s while the master is gone and, once the Sentinel has
promoted the replica, serves again by itself — cancel subscription included."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import httpx
import pytest
import redis
from redis_servers import cancel_wake_s, start_replica, start_sentinel
from speech_stack import speech_stack

from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.requests import RequestStore
from chorus.runtime.errors import Unavailable
from chorus.runtime.processes import free_port
from chorus.runtime.redis_server import start_local_redis

MASTER_NAME = "chorus"
FAILOVER_TIMEOUT_S = 30.0
SPEECH = {"model": "tiny", "input": "Hello.", "voice": "ryan", "response_format": "pcm", "max_frames": 10}


@pytest.fixture
def sentinel_deployment(tmp_path):
    """(master, replica, sentinel, url)."""
    master = start_local_redis(tmp_path / "master")
    replica = start_replica(tmp_path / "replica", master)
    sentinel = start_sentinel(tmp_path / "sentinel", master, MASTER_NAME)
    yield master, replica, sentinel, f"redis+sentinel://127.0.0.1:{sentinel.port}/{MASTER_NAME}/0"
    for server in (sentinel, replica, master):
        server.stop()


async def speak(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/v1/audio/speech", json=SPEECH)


def master_port_by_sentinel(sentinel_port: int) -> int:
    client = redis.Redis(port=sentinel_port, socket_timeout=1.0)
    try:
        return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])
    finally:
        client.close()


async def test_gateway_serves_through_sentinel_and_follows_a_failover(
    start_gateway, sentinel_deployment, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="chorus.gateway.cancel")
    master, replica, sentinel, url = sentinel_deployment
    async with speech_stack(start_gateway, url, str(tmp_path / "cache")) as (gateway, http, *_):
        context = gateway.context
        reply = await speak(http)
        assert reply.status_code == 200 and len(reply.content) > 0, reply.text
        request_id = reply.headers["x-request-id"]
        assert (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "done"
        # The record is on the master the Sentinel named, and replicated.
        stored_on = {}
        for server in (master, replica):
            client = redis.Redis(port=server.port, socket_timeout=1.0)
            stored_on[server.port] = bool(client.keys(f"*{request_id}*"))
            client.close()
        assert stored_on == {master.port: True, replica.port: True}
        assert (await http.get("/ready")).json()["redis"] is True
        with context.cancels.watch("held-across-the-failover"):  # the cancel listener is subscribed now
            await asyncio.sleep(0.2)

            killed_at = time.monotonic()
            master.process.kill()
            master.process.wait()
            reply = await speak(http)
            first_answer_s = time.monotonic() - killed_at
            assert reply.status_code == 503 and reply.json()["error"]["code"] == "unavailable", reply.text
            assert first_answer_s < 3.0, f"503 took {first_answer_s:.2f} s"

            while (reply := await speak(http)).status_code != 200:  # bounded: 503s come fast
                assert reply.status_code == 503, reply.text
                assert time.monotonic() - killed_at < FAILOVER_TIMEOUT_S, "no failover in time"
                await asyncio.sleep(0.2)
            recovered_s = time.monotonic() - killed_at
        assert master_port_by_sentinel(sentinel.port) == replica.port, "the replica was promoted"
        assert (await http.get(f"/v1/requests/{reply.headers['x-request-id']}")).json()["status"] == "done"
        assert (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "done", "replicated before"

        wake_s = await cancel_wake_s(context, url, caplog)  # on the new master
        assert wake_s < 1.0, f"the cancel took {wake_s:.2f} s: the pub/sub hint did not arrive"
        print(
            f"Sentinel failover: first 503 after {first_answer_s:.2f} s, speech served again "
            f"{recovered_s:.1f} s after the master was killed; cancel hint in {wake_s * 1000:.0f} ms"
        )


async def test_sentinels_down_or_hung_are_unavailable_fast(sentinel_deployment):
    _, _, sentinel, url = sentinel_deployment
    unreachable = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/{MASTER_NAME}"
    os.kill(sentinel.process.pid, signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        for target in (unreachable, url):
            client = open_redis(target)  # a fresh client: its first command must ask a Sentinel
            started = time.monotonic()
            with pytest.raises(Unavailable, match="Redis"):
                await RequestStore(client).create("speech", model="tiny")
            assert time.monotonic() - started < 2.0, target
            await client.aclose()
    finally:
        os.kill(sentinel.process.pid, signal.SIGCONT)

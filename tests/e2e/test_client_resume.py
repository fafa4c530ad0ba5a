"""Chorus's own clients keep a speech stream going when the gateway process serving it dies (SIGKILL): the REST
client goes on from the bytes it has, the gRPC client after the last chunk it got (`Resume`), through the same
address once a process answers there again (here the killed one, restarted a second later; behind one address of
several workers, any of them), while another gateway process takes the run over. The audio equals an undisturbed
run's (CPU fp32, one stream: within 1 LSB)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from cluster import Cluster

from chorus.client import AsyncClient, AsyncGrpcClient, Client, GrpcClient

TEXT = "Keep talking while the gateway process dies."
SAY = {"voice": "ryan", "seed": 5, "max_frames": 96, "response_format": "pcm"}


@pytest.fixture
def cluster(redis_url, tmp_path):
    env = {"CHORUS_GATEWAY_RECONNECT_GRACE_S": "10", "CHORUS_GATEWAY_HEALTH_INTERVAL_S": "0.5"}
    cluster = Cluster(redis_url, tmp_path, {"talker": 1, "vocoder": 1, "diffusion": 1}, gateways=2, env=env)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.int16).astype(np.int32)


@pytest.mark.timeout(240)
async def test_the_rest_clients_resume_a_stream_whose_gateway_process_died(cluster):
    gateway = cluster.of("gateway")[0]
    url = f"http://127.0.0.1:{gateway.rest_port}"

    def undisturbed() -> bytes:
        with Client(url) as client:
            return client.speech(TEXT, **SAY)

    def cut() -> tuple[bytes, int]:
        with Client(url, max_retries=8) as client, client.stream_speech(TEXT, **SAY) as (stream, pieces):
            received = next(pieces)
            cluster.kill(gateway)  # the process serving this stream
            whole = received + b"".join(pieces)
            assert stream.bytes_received == len(whole)
            return whole, len(received)

    whole = pcm(await asyncio.to_thread(undisturbed))
    resumed, before_kill = await asyncio.to_thread(cut)
    assert 0 < before_kill < 2 * len(whole)  # cut midway, not after the end
    assert len(pcm(resumed)) == len(whole) and np.abs(pcm(resumed) - whole).max() <= 1

    async with AsyncClient(url, max_retries=8) as client:
        pieces = client.stream_speech(TEXT, **SAY)
        received = await anext(pieces)
        await asyncio.to_thread(cluster.kill, gateway)
        received += b"".join([piece async for piece in pieces])
    assert len(pcm(received)) == len(whole) and np.abs(pcm(received) - whole).max() <= 1


@pytest.mark.timeout(240)
async def test_the_grpc_clients_resume_a_stream_whose_gateway_process_died(cluster):
    gateway = cluster.of("gateway")[0]
    target, model = f"127.0.0.1:{gateway.port}", "tiny"

    def undisturbed() -> bytes:
        with GrpcClient(target) as client:
            return client.speak(TEXT, model=model, **SAY)[1]

    def cut() -> tuple[bytes, int]:
        with GrpcClient(target, max_retries=8) as client:
            pieces = iter(client.stream_speak(TEXT, model=model, **SAY))
            received = next(pieces)
            cluster.kill(gateway)  # the process serving this stream
            return received + b"".join(pieces), len(received)

    whole = pcm(await asyncio.to_thread(undisturbed))
    resumed, before_kill = await asyncio.to_thread(cut)
    assert 0 < before_kill < 2 * len(whole)  # cut midway, not after the end
    assert len(pcm(resumed)) == len(whole) and np.abs(pcm(resumed) - whole).max() <= 1

    async with AsyncGrpcClient(target, max_retries=8) as client:
        stream = client.stream_speak(TEXT, model=model, **SAY)
        pieces = aiter(stream)
        received = await anext(pieces)
        await asyncio.to_thread(cluster.kill, gateway)
        received += b"".join([piece async for piece in pieces])
        assert stream.request_id
    assert len(pcm(received)) == len(whole) and np.abs(pcm(received) - whole).max() <= 1

"""Mid-stream fail-over on the real tiny talker and vocoder (CPU fp32): the process serving a segment is
SIGKILLed mid-stream, and the segment goes on on the other replica with the audio of an undisturbed run,
within 1e-5 (one stream: no batching differences)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from cluster import Cluster

from chorus.gateway.backends import BackendPool
from chorus.gateway.failover import FailoverPolicy
from chorus.gateway.speech_pipeline import synthesize_segment
from chorus.v1 import talker_pb2
from chorus.wire import chunk_to_pcm

NUM_FRAMES = 48
SAMPLES_PER_FRAME = 1920


@pytest.fixture(scope="module")
def cluster(redis_url, tmp_path_factory):
    cluster = Cluster(
        redis_url, tmp_path_factory.mktemp("failover"), {"talker": 2, "vocoder": 2, "diffusion": 0}, 0, {}
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


def request(request_id: str) -> talker_pb2.SynthesisRequest:
    return talker_pb2.SynthesisRequest(
        request_id=request_id, text="Keep talking while the replica dies.", speaker="vivian", seed=7,
        max_frames=NUM_FRAMES, ignore_eos=True,
    )  # fmt: skip


async def audio(pool: BackendPool, request_id: str, on_chunk=None) -> np.ndarray:
    policy = FailoverPolicy(replica_wait_s=5.0)
    pieces = []
    async for pcm in synthesize_segment(pool, request(request_id), policy):
        pieces.append(chunk_to_pcm(pcm).reshape(-1))
        if on_chunk is not None:
            await on_chunk(len(pieces))
    return np.concatenate(pieces)


@pytest.mark.parametrize("kind", ["talker", "vocoder"])
async def test_a_replica_killed_mid_stream_changes_nothing_in_the_audio(cluster, kind):
    targets = {k: tuple(f"127.0.0.1:{m.port}" for m in cluster.of(k)) for k in ("talker", "vocoder")}
    pool = BackendPool(targets, interval_s=0.1)
    pool.start()
    try:
        for _ in range(300):
            if all(r.is_healthy for found in pool.replicas.values() for r in found):
                break
            await asyncio.sleep(0.1)
        undisturbed = await audio(pool, f"undisturbed-{kind}")
        killed = []

        async def kill_serving_replica(num_chunks: int) -> None:
            if num_chunks != 3:
                return
            serving = [r.target for r in pool.replicas[kind] if r.num_active]
            assert len(serving) == 1
            member = next(m for m in cluster.of(kind) if serving[0].endswith(f":{m.port}"))
            await asyncio.to_thread(cluster.kill, member)
            killed.append(member.name)

        disturbed = await audio(pool, f"disturbed-{kind}", kill_serving_replica)
    finally:
        await pool.close()
    assert killed, "the replica was not killed mid-stream"
    assert disturbed.shape == undisturbed.shape == (NUM_FRAMES * SAMPLES_PER_FRAME,)
    assert np.abs(disturbed - undisturbed).max() <= 1e-5

"""Admission limits derived from what the backends report they serve (a `*_max_in_flight` of 0, the speech
default): split between gateway replicas (a replica's workers share its share), following replicas that come,
drain and go, and — from the settings `chorus up` gives its gateway to the limits of real talker and vocoder
services — 256 speech streams on CUDA, 64 on CPU."""

from __future__ import annotations

import asyncio
import os

import pytest
from grpc_health.v1 import health_pb2
from speech_stack import speech_stack
from test_backends import start_replica

from chorus.gateway.admission import BackendAdmission
from chorus.gateway.backends import BackendPool
from chorus.gateway.capacity import UNREPORTED_CAPACITY, DerivedLimits, share_of_capacity
from chorus.gateway.config import GatewayConfig
from chorus.gateway.workers import worker_config
from chorus.runtime.config import load_config
from chorus.stack import LocalStack, StackPorts
from chorus.talker.engine.engine import AUTO_SLOTS_CUDA, AUTO_SLOTS_ELSEWHERE
from chorus.v1 import common_pb2
from chorus.vocoder.config import VocoderConfig


def test_each_process_takes_its_share_rounded_up():
    assert share_of_capacity(256, 1) == 256
    assert share_of_capacity(256, 4) == 64
    assert share_of_capacity(64, 4) == 16
    assert share_of_capacity(100, 3) == 34  # 3 × 34 ≥ 100: rounding never leaves the backend idle
    assert share_of_capacity(0, 2) == 1


def test_explicit_limits_are_kept_and_bad_ones_named():
    config = GatewayConfig(talker_max_in_flight=48, workers=4, admission_split=2)
    assert worker_config(config).talker_max_in_flight == 48  # the gateway's, as set: its workers share it
    assert worker_config(config).admission_split == 2  # gateway replicas; its workers share one share
    with pytest.raises(ValueError, match="vocoder_max_in_flight"):
        GatewayConfig(vocoder_max_in_flight=-1)
    with pytest.raises(ValueError, match="admission_split"):
        GatewayConfig(admission_split=0)


async def until(predicate, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the limit did not follow")


async def test_a_derived_limit_follows_the_replicas_that_serve():
    replicas = [await start_replica() for _ in range(2)]
    pool = BackendPool({"talker": tuple(replica[3] for replica in replicas)}, interval_s=0.05)
    admission = BackendAdmission("talker", share_of_capacity(UNREPORTED_CAPACITY, 2), max_queued=8, queue_timeout_s=5)
    pool.on_checked = DerivedLimits(pool, {"talker": admission}, admission_split=2).update
    (_, first, _, _), (second_server, second, second_health, _) = replicas
    first.report = common_pb2.LoadReport(live_streams=6, free_slots=250)
    second.report = common_pb2.LoadReport(free_slots=256)
    assert admission.max_in_flight == 32  # nothing reported yet
    pool.start()
    try:
        await until(lambda: admission.max_in_flight == 256)  # 2 × 256 slots, split between 2 processes
        second.report = common_pb2.LoadReport(free_slots=256, is_draining=True)
        await until(lambda: admission.max_in_flight == 128)
        second.report = common_pb2.LoadReport(free_slots=256)
        await until(lambda: admission.max_in_flight == 256)
        await second_health.set("chorus.v1.Talker", health_pb2.HealthCheckResponse.NOT_SERVING)
        await until(lambda: admission.max_in_flight == 128)
        await second_server.stop(None)
        await replicas[0][0].stop(None)
        await until(lambda: not any(replica.is_healthy for replica in pool.replicas["talker"]))
        assert admission.max_in_flight == 128  # unchanged while nothing serves: no request is admitted then
    finally:
        await pool.close()
        for server, *_ in replicas:
            await server.stop(None)


@pytest.mark.parametrize(
    ("talker_device", "talker_slots"),
    [("cuda", AUTO_SLOTS_CUDA), ("cpu", AUTO_SLOTS_ELSEWHERE)],
    ids=["cuda", "cpu"],
)
async def test_chorus_up_admits_what_its_talker_serves(start_gateway, redis_url, tmp_path, talker_device, talker_slots):
    """The gateway settings `chorus up` resolves for a talker on `talker_device`, against real tiny talker and
    vocoder services with the decode slots that device gives them at their defaults (the talker runs on CPU here:
    256 slots stand in for CUDA's)."""
    stack = LocalStack(
        StackPorts.choose(0, 0), redis_url=redis_url, extra_env={"CHORUS_TALKER_DEVICE": talker_device}, log=print
    )
    config = load_config(GatewayConfig, environ=stack._env_for("gateway"))
    assert config.talker_max_in_flight == config.vocoder_max_in_flight == 0  # derived, by default
    assert config.workers == (min(4, len(os.sched_getaffinity(0))) if talker_device == "cuda" else 1)
    worker = worker_config(config) if config.workers > 1 else config
    talker = {"max_streams": talker_slots, "max_positions": 256, "max_frames": 40}
    vocoder = {"max_streams": VocoderConfig().max_streams}
    async with speech_stack(
        start_gateway, redis_url, str(tmp_path), talker, vocoder, admission_split=worker.admission_split
    ) as (gateway, *_):
        replicas = gateway.context.backends.replicas
        await until(lambda: all(replicas[kind][0].capacity is not None for kind in ("talker", "vocoder")))
        limits = gateway.context.admission.backends
        # One gateway's limit, which its workers share (`host_slots`).
        speech_streams = min(limits["talker"].max_in_flight, limits["vocoder"].max_in_flight)
        assert speech_streams == talker_slots

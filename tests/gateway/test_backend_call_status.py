"""The gateway ends its backend calls the way they end: on the replica's own status after its Final.

Cancelling a call once its Final has arrived races the replica's status: the replica then counts (and logs) a
successful stream as cancelled by the client, and gRPC logs its failed status send as an error. Real tiny
services on loopback, real Redis; each replica here ends its calls a moment after their Final, which makes the race
certain."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY
from speech_stack import hosted, speech_stack, until_healthy

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService, DiffusionServicer
from chorus.talker.service import TalkerServicer
from chorus.vocoder.service import VocoderServicer

CLOSING_DELAY_S = 0.2  # after its Final, each replica takes this long to end the call


def _slow_to_close(handler):
    async def handle(self, requests, context):
        async for message in handler(self, requests, context):
            yield message
        await asyncio.sleep(CLOSING_DELAY_S)

    return handle


def _counts(methods: tuple[tuple[str, str], ...]) -> dict[tuple[str, str, str], float]:
    return {(*method, code): _calls(*method, code) for method in methods for code in ("OK", "CANCELLED")}


def _calls(service: str, method: str, code: str) -> float:
    labels = {"service": service, "method": method, "code": code}
    return REGISTRY.get_sample_value("chorus_rpcs_total", labels) or 0.0


async def test_backend_calls_end_with_the_replicas_status_not_a_cancel(start_gateway, redis_url, tmp_path, monkeypatch):
    monkeypatch.setattr(TalkerServicer, "Synthesize", _slow_to_close(TalkerServicer.Synthesize))
    monkeypatch.setattr(VocoderServicer, "Decode", _slow_to_close(VocoderServicer.Decode))
    methods = (("talker", "Synthesize"), ("vocoder", "Decode"))
    before = _counts(methods)
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, *_):
        for seed in (1, 2):
            body = {"model": "tiny", "input": "Hello there.", "voice": "ryan", "seed": seed, "max_frames": 12}
            response = await http.post("/v1/audio/speech", json=body | {"response_format": "pcm"})
            assert response.status_code == 200 and response.content, response.text
    after = {key: count - before[key] for key, count in _counts(methods).items()}
    for method in methods:
        assert after[(*method, "OK")] == 2 and after[(*method, "CANCELLED")] == 0, (method, after)


async def test_a_diffusion_call_ends_with_the_replicas_status_not_a_cancel(start_gateway, redis_url, monkeypatch):
    monkeypatch.setattr(DiffusionServicer, "Generate", _slow_to_close(DiffusionServicer.Generate))
    methods = (("diffusion", "Generate"),)
    before = _counts(methods)
    config = DiffusionConfig(device="cpu", metrics_port=-1, grace_s=1.0)
    async with (
        hosted(config, DiffusionService(config)) as target,
        start_gateway(redis_url, diffusion_targets=(target,)) as (gateway, http, _),
    ):
        await until_healthy(gateway, ("diffusion",))
        body = {"model": "stable-audio-open-1.0", "prompt": "rain", "duration_s": 0.5, "num_steps": 3}
        response = await http.post("/v1/audio/generations", json=body | {"response_format": "wav"})
        assert response.status_code == 200 and response.content, response.text
    after = {key: count - before[key] for key, count in _counts(methods).items()}
    assert after == {("diffusion", "Generate", "OK"): 1, ("diffusion", "Generate", "CANCELLED"): 0}, after

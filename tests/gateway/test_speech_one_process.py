"""`chorus serve speech`: talker and vocoder in one process serve the gateway like two; same audio, and the
ignore_eos benchmark extension runs every request to max_frames."""

from __future__ import annotations

import asyncio

import pytest

from chorus.runtime.host import ServiceHost
from chorus.speech import SpeechConfig, SpeechService

SAMPLE_RATE_HZ = 24_000
SAMPLES_PER_FRAME = 1920


@pytest.fixture
async def one_process(start_gateway, redis_url, tmp_path, monkeypatch):
    for name, value in {
        "CHORUS_TALKER_DEVICE": "cpu", "CHORUS_TALKER_MAX_STREAMS": "4", "CHORUS_TALKER_CHUNK_FRAMES": "4",
        "CHORUS_TALKER_MAX_FRAMES": "40", "CHORUS_TALKER_CACHE_DIR": str(tmp_path),
        "CHORUS_VOCODER_DEVICE": "cpu", "CHORUS_VOCODER_MAX_STREAMS": "4",
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    config = SpeechConfig(metrics_port=-1, grace_s=1.0)
    host = ServiceHost(config, SpeechService(config))
    await host.start()
    target = f"127.0.0.1:{host.port}"
    try:
        async with start_gateway(redis_url, talker_targets=(target,), vocoder_targets=(target,)) as (gateway, http, _):
            replicas = gateway.context.backends.replicas
            for _ in range(200):
                if all(replicas[kind][0].is_healthy for kind in ("talker", "vocoder")):
                    break
                await asyncio.sleep(0.05)
            yield http
    finally:
        await host.stop()


async def test_speech_through_one_process_and_ignore_eos_runs_to_max_frames(one_process):
    http = one_process
    body = {"model": "tiny", "input": "Hello there.", "voice": "ryan", "seed": 3, "response_format": "pcm"}
    reply = await http.post("/v1/audio/speech", json=body | {"max_frames": 17, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert len(reply.content) == 17 * SAMPLES_PER_FRAME * 2, "exactly max_frames of 16-bit audio"
    natural = await http.post("/v1/audio/speech", json=body | {"max_frames": 17})
    assert len(natural.content) <= len(reply.content)
    missing = await http.post("/v1/audio/speech", json=body | {"ignore_eos": True})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "ignore_eos"


def test_bad_component_settings_exit_with_a_message(monkeypatch):
    monkeypatch.setenv("CHORUS_TALKER_MAX_STREAMS", "many")
    with pytest.raises(SystemExit, match=r"chorus serve speech: .*CHORUS_TALKER_MAX_STREAMS"):
        SpeechService(SpeechConfig())

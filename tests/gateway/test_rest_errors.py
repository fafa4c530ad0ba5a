"""Every REST error path answers the OpenAI envelope, over real HTTP to a running gateway."""

from __future__ import annotations

import base64
import json
import time

import numpy as np
import openai
import pytest

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.state.auth import hash_key
from chorus.gateway.state.requests import CANCELLED, RUNNING
from chorus.runtime.processes import free_port

KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD_SPEECH = {"model": "qwen3-tts", "input": "Hello there.", "voice": "vivian"}


def wav_base64(duration_s: float = 0.3) -> str:
    encoder = StreamingEncoder("wav", 24_000)
    samples = 0.3 * np.sin(np.linspace(0, 2 * np.pi * 200 * duration_s, int(24_000 * duration_s)))
    return base64.b64encode(encoder.encode(samples.astype(np.float32)) + encoder.flush()).decode()


def speech(**changes) -> dict:
    return {key: value for key, value in (GOOD_SPEECH | changes).items() if value is not None}


# (name, method, path, headers, body as JSON-able or raw bytes, status, param)
BAD_INPUTS = [
    ("missing key", "POST", "/v1/audio/speech", {}, GOOD_SPEECH, 401, None),
    ("unknown key", "POST", "/v1/audio/speech", {"Authorization": "Bearer nope"}, GOOD_SPEECH, 401, None),
    ("empty input", "POST", "/v1/audio/speech", AUTH, speech(input="   "), 400, "input"),
    ("input too long", "POST", "/v1/audio/speech", AUTH, speech(input="a" * 201), 400, "input"),
    ("speed too high", "POST", "/v1/audio/speech", AUTH, speech(speed=4.5), 400, "speed"),
    ("speed too low", "POST", "/v1/audio/speech", AUTH, speech(speed=0.1), 400, "speed"),
    ("unknown format", "POST", "/v1/audio/speech", AUTH, speech(response_format="ogg"), 400, "response_format"),
    ("unknown stream format", "POST", "/v1/audio/speech", AUTH, speech(stream_format="ws"), 400, "stream_format"),
    ("bad top_p", "POST", "/v1/audio/speech", AUTH, speech(sampling={"top_p": 1.5}), 400, "sampling.top_p"),
    ("negative seed", "POST", "/v1/audio/speech", AUTH, speech(seed=-1), 400, "seed"),
    ("zero max_frames", "POST", "/v1/audio/speech", AUTH, speech(max_frames=0), 400, "max_frames"),
    ("x_vector_only alone", "POST", "/v1/audio/speech", AUTH, speech(x_vector_only=True), 400, "x_vector_only"),
    ("ref_audio not base64", "POST", "/v1/audio/speech", AUTH, speech(ref_audio="%%%"), 400, "ref_audio"),
    (
        "ref_audio not audio",
        "POST",
        "/v1/audio/speech",
        AUTH,
        speech(ref_audio=base64.b64encode(b"hello, not audio" * 64).decode()),
        400,
        "ref_audio",
    ),
    (
        "ref_audio URL not allowed",
        "POST",
        "/v1/audio/speech",
        AUTH,
        speech(ref_audio="http://169.254.169.254/latest/meta-data"),
        400,
        "ref_audio",
    ),
    ("missing input", "POST", "/v1/audio/speech", AUTH, speech(input=None), 422, "input"),
    ("input not a string", "POST", "/v1/audio/speech", AUTH, speech(input=42), 422, "input"),
    ("unknown field", "POST", "/v1/audio/speech", AUTH, speech(voice_id="x"), 422, "voice_id"),
    ("malformed JSON", "POST", "/v1/audio/speech", AUTH, b'{"model": "qwen3-tts",', 422, None),
    ("oversized body", "POST", "/v1/audio/speech", AUTH, speech(ref_audio="A" * 5000), 413, None),
    (
        "bad duration",
        "POST",
        "/v1/audio/generations",
        AUTH,
        {"model": "sao", "prompt": "rain", "duration_s": 60},
        400,
        "duration_s",
    ),
    ("empty prompt", "POST", "/v1/audio/generations", AUTH, {"model": "sao", "prompt": ""}, 400, "prompt"),
    ("unknown request", "GET", "/v1/requests/does-not-exist", AUTH, None, 404, None),
    ("unknown route", "GET", "/v1/nothing-here", AUTH, None, 404, None),
]


def assert_envelope(reply, status: int, param: str | None = None) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and isinstance(error["type"], str)
    assert error["param"] == param
    return error


async def test_bad_inputs_get_their_4xx_with_the_envelope(start_gateway, redis_url):
    async with start_gateway(redis_url, api_keys=(KEY,), max_input_chars=200, max_body_bytes=4000) as (_, client, _):
        for name, method, path, headers, body, status, param in BAD_INPUTS:
            if isinstance(body, bytes):
                raw_headers = headers | {"content-type": "application/json"}
                reply = await client.request(method, path, headers=raw_headers, content=body)
            else:
                reply = await client.request(method, path, headers=headers, json=body)
            assert reply.status_code == status, f"{name}: {reply.status_code} {reply.text}"
            assert_envelope(reply, status, param)

        for content_type in ("text/plain", "application/x-www-form-urlencoded"):
            headers = AUTH | {"content-type": content_type}
            reply = await client.post("/v1/audio/speech", headers=headers, content=json.dumps(GOOD_SPEECH))
            assert_envelope(reply, 415)


async def test_chunked_oversized_body_is_cut_off(start_gateway, redis_url):
    async with start_gateway(redis_url, max_body_bytes=4000) as (_, client, _):

        async def chunks():
            yield json.dumps(speech(ref_audio="A" * 8000)).encode()

        reply = await client.post("/v1/audio/speech", headers={"content-type": "application/json"}, content=chunks())
        assert_envelope(reply, 413)


async def test_valid_speech_needs_healthy_backends_503_with_retry_after(start_gateway, redis_url):
    async with start_gateway(redis_url) as (_, client, _):
        for body in (speech(), speech(ref_audio=wav_base64(), ref_text="Hi."), speech(speed=2.0, stream_format="sse")):
            reply = await client.post("/v1/audio/speech", json=body)
            error = assert_envelope(reply, 503)
            assert "talker" in error["message"] and reply.headers["retry-after"] == "1"
        reply = await client.post("/v1/audio/generations", json={"model": "sao", "prompt": "rain on a tin roof"})
        assert "diffusion" in assert_envelope(reply, 503)["message"]
        for path in ("/v1/models", "/v1/audio/voices"):
            assert "talker" in assert_envelope(await client.get(path), 503)["message"]


async def test_rate_limit_answers_429_with_retry_after(start_gateway, redis_url):
    key = f"key-{time.monotonic_ns()}"
    async with start_gateway(redis_url, api_keys=(key,), rate_limit_per_s=0.5, rate_limit_burst=2) as (_, client, _):
        headers = {"Authorization": f"Bearer {key}"}
        statuses = [(await client.get("/v1/requests/x", headers=headers)).status_code for _ in range(3)]
        assert statuses == [404, 404, 429]
        reply = await client.get("/v1/requests/x", headers=headers)
        assert_envelope(reply, 429)
        assert 1 <= int(reply.headers["retry-after"]) <= 2


async def test_redis_outage_is_503_fast_and_the_gateway_stays_up(start_gateway):
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    async with start_gateway(dead_redis, rate_limit_per_s=10) as (_, client, _):
        for _ in range(3):
            started = time.monotonic()
            reply = await client.get("/v1/requests/abc")
            assert time.monotonic() - started < 1.5
            assert "Redis" in assert_envelope(reply, 503)["message"]
        assert (await client.get("/health")).status_code == 200
    async with start_gateway(dead_redis) as (_, client, _):  # no rate limit: the voice store meets the outage
        for method in ("GET", "DELETE"):
            reply = await client.request(method, "/v1/audio/voices/alice")
            assert "Redis" in assert_envelope(reply, 503)["message"] and "voice" in reply.json()["error"]["message"]


async def test_request_status_and_cancel_respect_the_owner(start_gateway, redis_url):
    other = "other-key"
    async with start_gateway(redis_url, api_keys=(KEY, other)) as (gateway, client, _):
        requests = gateway.context.requests
        record = await requests.create("speech", model="qwen3-tts", voice="vivian", owner=hash_key(KEY)[:12])
        await requests.transition(record.request_id, RUNNING)

        reply = await client.get(f"/v1/requests/{record.request_id}", headers=AUTH)
        assert reply.status_code == 200
        view = reply.json()
        assert (view["id"], view["status"], view["voice"]) == (record.request_id, RUNNING, "vivian")
        assert view["started_at"] >= view["created_at"]

        other_headers = {"Authorization": f"Bearer {other}"}
        assert_envelope(await client.get(f"/v1/requests/{record.request_id}", headers=other_headers), 404)
        assert_envelope(await client.post(f"/v1/requests/{record.request_id}/cancel", headers=other_headers), 404)

        reply = await client.post(f"/v1/requests/{record.request_id}/cancel", headers=AUTH)
        assert reply.status_code == 200 and reply.json()["status"] == RUNNING  # the runner finishes the cancel
        assert await requests.is_cancel_requested(record.request_id)
        await requests.transition(record.request_id, CANCELLED)
        assert (await client.get(f"/v1/requests/{record.request_id}", headers=AUTH)).json()["status"] == CANCELLED


async def test_openai_sdk_sees_typed_errors(start_gateway, redis_url):
    async with start_gateway(redis_url, api_keys=(KEY,)) as (gateway, _, _):
        base_url = f"http://127.0.0.1:{gateway.rest_port}/v1"
        sdk = openai.AsyncOpenAI(api_key=KEY, base_url=base_url, max_retries=0)
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.audio.speech.create(model="qwen3-tts", input="", voice="vivian")
        assert bad.value.param == "input" and bad.value.type == "invalid_request_error"
        with pytest.raises(openai.InternalServerError) as down:
            await sdk.audio.speech.create(model="qwen3-tts", input="Hello.", voice="vivian", response_format="wav")
        assert down.value.status_code == 503
        wrong_key = openai.AsyncOpenAI(api_key="nope", base_url=base_url, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await wrong_key.audio.speech.create(model="qwen3-tts", input="Hello.", voice="vivian")
        await sdk.close()
        await wrong_key.close()


async def test_metrics_and_openapi_are_published(start_gateway, redis_url):
    async with start_gateway(redis_url) as (_, client, _):
        await client.get("/v1/requests/missing")
        metrics = (await client.get("/metrics")).text
        assert 'chorus_gateway_requests_total{endpoint="/v1/requests/{request_id}",outcome="404"}' in metrics
        assert "chorus_gateway_queue_depth" in metrics
        schema = (await client.get("/openapi.json")).json()
        speech_body = schema["paths"]["/v1/audio/speech"]["post"]["requestBody"]["content"]["application/json"]
        assert speech_body["schema"]["$ref"].endswith("/SpeechRequest")
        properties = schema["components"]["schemas"]["SpeechRequest"]["properties"]
        assert {"input", "voice", "ref_audio", "sampling"} <= set(properties)

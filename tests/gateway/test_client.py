"""The Python client (REST and gRPC, blocking and async) and the `chorus say/gen/voices/status/resume` commands
against a real tiny stack."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys

import av
import httpx
import pytest
from speech_stack import hosted, reference_wav, speech_stack

from chorus.cli import main
from chorus.client import APIError, AsyncClient, AsyncGrpcClient, Client, GatewayUnreachable, GrpcClient, retries
from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.runtime.processes import free_port

SAY = {"voice": "ryan", "seed": 3, "max_frames": 12}


def decoded(data: bytes) -> tuple[int, float]:
    with av.open(io.BytesIO(data)) as container:
        rate = container.streams.audio[0].rate
        samples = sum(frame.samples for frame in container.decode(audio=0))
    return rate, samples / rate


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    config = DiffusionConfig(device="cpu", metrics_port=-1, grace_s=1.0)
    async with (
        hosted(config, DiffusionService(config)) as diffusion,
        speech_stack(start_gateway, redis_url, str(tmp_path), diffusion_targets=(diffusion,)) as (
            gateway, http, target, _, _,
        ),
    ):  # fmt: skip
        for _ in range(200):
            if gateway.context.backends.replicas["diffusion"][0].is_healthy:
                break
            await asyncio.sleep(0.05)
        yield str(http.base_url), target


def in_thread(function, *args, **kwargs):
    return asyncio.to_thread(function, *args, **kwargs)


async def test_rest_clients_speak_stream_resume_and_list(stack):
    url, _ = stack

    def blocking():
        with Client(url) as client:
            wav = client.speech("Hello there.", **SAY)
            with client.stream_speech("Hello there.", **SAY) as (stream, pieces):
                first = next(pieces)
            rest = b"".join(client.resume(stream.request_id, offset_bytes=len(first)))
            whole = client.speech("Hello there.", response_format="pcm", **SAY)
            return wav, first + rest, whole, client.voices(), client.status(stream.request_id)

    wav, resumed, whole, voices, status = await in_thread(blocking)
    rate, duration_s = decoded(wav)
    assert rate == 24_000 and duration_s > 0
    assert resumed == whole, "a cut stream resumed from its byte count is the uninterrupted audio"
    assert "ryan" in voices["voices"] and status["status"] == "done"
    async with AsyncClient(url) as client:
        pcm = await client.speech("Hello there.", response_format="pcm", **SAY)
        streamed = b"".join([piece async for piece in client.stream_speech("Hello there.", **SAY)])
        assert pcm == streamed == whole
        assert (await client.models())[0]["id"]


async def test_grpc_clients_speak_and_list(stack):
    url, target = stack
    model = (await AsyncClient(url).models())[0]["id"]
    async with AsyncGrpcClient(target) as client:
        request_id, pcm = await client.speak("Hello there.", model=model, response_format="pcm", **SAY)
        assert request_id and "ryan" in await client.voices()

    def blocking():
        with GrpcClient(target) as client:
            return client.speak("Hello there.", model=model, response_format="pcm", **SAY)[1]

    assert await in_thread(blocking) == pcm and len(pcm) > 0


async def test_grpc_clients_stream_and_raise_for_a_request_that_failed_after_it_began(stack):
    """A request that ends failed after its stream began (its id sent, the talker refusing it) ends the call with
    that error, never with what it made as if it were the whole."""
    url, target = stack
    model = (await AsyncClient(url).models())[0]["id"]
    async with AsyncGrpcClient(target) as client:
        streamed = client.stream_speak("Hello there.", model=model, **SAY)
        pieces = [piece async for piece in streamed]
        _, whole = await client.speak("Hello there.", model=model, response_format="pcm", **SAY)
        assert len(pieces) > 1 and b"".join(pieces) == whole and streamed.request_id
        with pytest.raises(APIError) as failed:
            await client.speak("Hello there.", model=model, voice="ryan", max_frames=100_000)
    assert failed.value.status == "INVALID_ARGUMENT" and "max_frames" in failed.value.message, failed.value
    assert failed.value.request_id

    def blocking() -> bytes:
        with GrpcClient(target) as client:
            with pytest.raises(APIError, match="max_frames"):
                client.speak("Hello there.", model=model, voice="ryan", max_frames=100_000)
            return b"".join(client.stream_speak("Hello there.", model=model, **SAY))

    assert await in_thread(blocking) == whole


async def test_errors_carry_the_envelope_and_unreachable_is_clear(stack):
    url, target = stack
    async with AsyncClient(url) as client:
        with pytest.raises(APIError) as error:
            await client.speech("Hello.", voice="nobody")
    assert error.value.status == 404 and error.value.type and "voice" in error.value.message
    unreachable = r"cannot reach the Chorus gateway at http://127\.0\.0\.1:9"
    with pytest.raises(GatewayUnreachable, match=unreachable), Client("http://127.0.0.1:9") as client:
        client.voices()
    with pytest.raises(APIError) as grpc_error, GrpcClient(target) as client:
        await in_thread(client.speak, "Hello.", model="tiny", voice="nobody")
    assert grpc_error.value.status == "NOT_FOUND"


async def test_cli_commands(stack, tmp_path, capsys):
    url, _ = stack
    out = tmp_path / "hello.wav"
    assert await in_thread(main, ["say", "Hello there.", "-o", str(out), "--url", url, "--seed", "3"]) == 0
    assert decoded(out.read_bytes())[0] == 24_000
    streamed = tmp_path / "hello.pcm"
    assert await in_thread(main, ["say", "Hi.", "-o", str(streamed), "--stream", "--url", url]) == 0
    assert streamed.stat().st_size > 0 and "first audio after" in capsys.readouterr().err
    audio = tmp_path / "rain.wav"
    # Enough steps for the progress events (polled) to show while it runs, as in test_generation.
    argv = ["gen", "rain", "-o", str(audio), "--url", url, "--steps", "100", "--duration", "0.5"]
    assert await in_thread(main, argv) == 0
    assert decoded(audio.read_bytes())[0] == 44_100 and "/100" in capsys.readouterr().err
    assert await in_thread(main, ["voices", "--url", url]) == 0
    assert "ryan" in json.loads(capsys.readouterr().out)["voices"]
    assert await in_thread(main, ["status", "no-such-request", "--url", url]) == 1
    assert "chorus status: 404" in capsys.readouterr().err


async def test_clients_and_cli_save_use_and_delete_voices(stack, tmp_path, capsys):
    url, target = stack
    reference = tmp_path / "me.wav"
    reference.write_bytes(reference_wav())
    argv = ["voices", "--url", url, "add", "Me", str(reference), "--ref-text", "A tone."]  # --url before the action
    assert await in_thread(main, argv) == 0
    saved = json.loads(capsys.readouterr().out)
    assert (saved["name"], saved["kind"], saved["x_vector_only"]) == ("Me", "clone", False)
    out = tmp_path / "me-says.wav"
    assert await in_thread(main, ["say", "Hello there.", "-o", str(out), "--voice", "Me", "--url", url]) == 0
    assert decoded(out.read_bytes())[0] == 24_000
    assert await in_thread(main, ["voices", "ls", "--url", url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "ryan" in listed["voices"] and saved["id"] in [voice["id"] for voice in listed["data"]]
    assert await in_thread(main, ["voices", "add", "Calm", "--instructions", "A calm voice.", "--url", url]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "design"
    for name in ("Me", "Calm"):
        assert await in_thread(main, ["voices", "rm", name, "--url", url]) == 0
    assert await in_thread(main, ["voices", "rm", "Me", "--url", url]) == 1
    assert "chorus voices: 404" in capsys.readouterr().err

    say = {"seed": 3, "max_frames": 12, "response_format": "pcm"}

    def blocking():
        with Client(url) as client:
            voice = client.create_voice("Rest voice", reference_wav(), ref_text="A tone.")
            pcm = client.speech("Hello there.", voice="rest voice", **say)
            same = client.speech("Hello there.", voice=client.voice("Rest voice")["id"], **say)
            assert voice["id"] == client.voice("REST VOICE")["id"]
            first_page = client.voices(limit=1)
            client.delete_voice("Rest voice")
            return pcm, same, first_page

    pcm, same, first_page = await in_thread(blocking)
    assert pcm == same and len(pcm) > 0 and len(first_page["data"]) == 1 and first_page["has_more"]
    async with AsyncClient(url) as client:
        voice = await client.create_voice("Async voice", instructions="A calm voice.")
        assert (await client.voice("async voice"))["id"] == voice["id"]
        assert await client.speech("Hello there.", voice="Async voice", **say)
        assert (await client.delete_voice(voice["id"]))["deleted"] is True
    model = (await AsyncClient(url).models())[0]["id"]
    async with AsyncGrpcClient(target) as client:
        voice = await client.create_voice("Grpc voice", reference_wav(), ref_text="A tone.")
        assert "Grpc voice" in await client.voices() and (await client.voice(voice.id)).name == "Grpc voice"
        _, grpc_pcm = await client.speak("Hello there.", model=model, voice="Grpc voice", **say)
        assert grpc_pcm == pcm  # the same reference and transcript: the same audio
        assert (await client.delete_voice("Grpc voice")).id == voice.id

    def blocking_grpc():
        with GrpcClient(target) as client:
            voice = client.create_voice("Sync grpc voice", instructions="A calm voice.")
            assert client.voice("sync grpc voice").id == voice.id
            return client.delete_voice(voice.id)

    assert (await in_thread(blocking_grpc)).name == "Sync grpc voice"


async def test_the_rest_client_tries_a_refused_call_again_until_the_gateway_serves_it(start_gateway, redis_url):
    """No diffusion replica yet: the gateway answers 503 (Retry-After: 1). With retries off the call fails at once;
    with them, a call made before the replica starts returns its audio once it is up."""
    port = free_port()
    async with start_gateway(redis_url, diffusion_targets=(f"127.0.0.1:{port}",)) as (_, http, _):
        url = str(http.base_url)

        def generate(max_retries: int) -> bytes:
            with Client(url, max_retries=max_retries) as client:
                return client.generate("rain", num_steps=4, duration_s=0.2)

        with pytest.raises(APIError) as refused:
            await in_thread(generate, 0)
        assert refused.value.status == 503
        generating = asyncio.ensure_future(in_thread(generate, 5))
        await asyncio.sleep(0.5)
        assert not generating.done()
        config = DiffusionConfig(device="cpu", port=port, metrics_port=-1, grace_s=1.0)
        async with hosted(config, DiffusionService(config)):
            audio = await asyncio.wait_for(generating, timeout=30)
    assert decoded(audio)[0] == 44_100


def test_which_failures_the_rest_client_tries_again():
    def request(method: str, **headers: str) -> httpx.Request:
        return httpx.Request(method, "http://gateway/v1/x", headers=headers)

    keyed_post = request("POST", **{retries.IDEMPOTENCY_HEADER: "k"})
    refused = httpx.Response(503, headers={"retry-after": "2"})
    broken = httpx.ReadError("connection reset")
    assert retries.should_retry(0, 2, request("POST"), refused)  # refused for now: nothing was done
    assert retries.should_retry(1, 2, request("POST"), httpx.Response(429))
    assert not retries.should_retry(2, 2, request("POST"), refused)  # out of retries
    assert not retries.should_retry(0, 2, request("POST"), httpx.Response(500))  # a bug does not go away
    assert not retries.should_retry(0, 2, request("POST"), httpx.Response(404))
    assert retries.should_retry(0, 2, request("DELETE"), httpx.ConnectError("refused"))  # never sent
    assert not retries.should_retry(0, 2, request("POST"), broken)  # sent, maybe done: not safe again
    assert retries.should_retry(0, 2, keyed_post, broken) and retries.should_retry(0, 2, request("GET"), broken)
    assert retries.delay_s(0, refused) == 2.0
    assert retries.delay_s(3, httpx.Response(503, headers={"retry-after": "600"})) == retries.MAX_DELAY_S
    assert [retries.delay_s(attempt, broken) for attempt in range(3)] == [0.5, 1.0, 2.0]


def test_cli_connection_error_is_one_line_without_traceback(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "chorus.cli", "say", "Hi.", "-o", str(tmp_path / "x.wav"), "--url", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert completed.returncode == 1
    assert completed.stderr.strip().startswith("chorus say: cannot reach the Chorus gateway at http://127.0.0.1:9")
    assert "Traceback" not in completed.stderr

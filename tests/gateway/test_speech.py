"""Speech end to end: the real gateway in front of the real tiny talker and vocoder, real Redis."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math

import av
import grpc
import numpy as np
import openai
import pytest
from speech_stack import reference_wav, speech_stack

from chorus.gateway.voice_clone import ReferenceCodes
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc

SAMPLE_RATE_HZ = 24_000
SAMPLES_PER_FRAME = 1920  # 12.5 Hz codec


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (gateway, http, target, _, vocoder):
        yield gateway, http, target, vocoder


def speech(**fields) -> dict:
    defaults = {"model": "tiny", "input": "Hello there. How are you today?", "voice": "ryan", "seed": 3}
    return defaults | {"language": "english", "max_frames": 30} | fields


def decode(data: bytes, format_name: str | None = None) -> tuple[int, np.ndarray]:
    with av.open(io.BytesIO(data), format=format_name) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        return stream.rate, np.concatenate(frames)


@pytest.mark.parametrize("response_format", ["wav", "mp3", "opus", "aac", "flac"])
async def test_speech_decodes_in_every_format(stack, response_format):
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/speech", json=speech(response_format=response_format))
    assert reply.status_code == 200, reply.text
    rate, samples = decode(reply.content)
    assert rate in (SAMPLE_RATE_HZ, 48_000) and samples.size > 0
    record = (await http.get(f"/v1/requests/{reply.headers['x-request-id']}")).json()
    assert record["status"] == "done" and record["usage"]["audio_s"] > 0


async def test_speech_wav_and_pcm_carry_the_same_samples(stack):
    _, http, _, _ = stack
    wav = await http.post("/v1/audio/speech", json=speech(response_format="wav"))
    pcm = await http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    assert wav.status_code == pcm.status_code == 200
    assert wav.content[44:] == pcm.content and len(pcm.content) % (2 * SAMPLES_PER_FRAME) == 0
    record = (await http.get(f"/v1/requests/{wav.headers['x-request-id']}")).json()
    assert len(pcm.content) / 2 / SAMPLE_RATE_HZ == pytest.approx(record["usage"]["audio_s"])
    # The talker's own timings of the segment, from its admission there: its queue, first frame, Final in order.
    timings = record["usage"]["timings"]
    assert 0 <= timings["queue_ms"] <= timings["first_output_ms"] <= timings["total_ms"], timings
    # When the gateway opened the talker call, the talker took it in and admitted it, on its clock (this host's): in
    # that order, after the run started, before the first frames came.
    timeline = record["timeline"]
    marks = ("started_ms", "talker_called_ms", "talker_received_ms", "talker_admitted_ms", "first_frame_ms")
    assert [timeline[mark] for mark in marks] == sorted(timeline[mark] for mark in marks), timeline
    assert list(timeline.values()) == sorted(timeline.values()), "the stages in time order"


async def test_a_runs_first_pieces_are_timed_on_its_timeline(stack):
    """The first audio's frames, PCM and first bytes, then each next piece's frames, PCM and journal write, in order
    (`chorus bench tts` splits TTFP and the waits of players that ran dry at these marks); only the first four; and
    the end of its frames and PCM (it splits the latency there)."""
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/speech", json=speech(response_format="pcm", max_frames=40))
    assert reply.status_code == 200 and len(reply.content) == 40 * 2 * SAMPLES_PER_FRAME  # pieces of 1, 2, 4, 8, …
    timeline = (await http.get(f"/v1/requests/{reply.headers['x-request-id']}")).json()["timeline"]
    pieces = [[timeline[f"first_{stage}_ms"] for stage in ("frame", "pcm", "audio")]]
    pieces += [[timeline[f"{stage}_{piece}_ms"] for stage in ("frames", "pcm", "journaled")] for piece in (1, 2, 3)]
    for (frames, pcm, journaled), (next_frames, next_pcm, _) in zip(pieces, [*pieces[1:], [math.inf] * 3], strict=True):
        assert frames <= pcm <= journaled <= next_pcm and frames <= next_frames, timeline
    assert "pcm_4_ms" not in timeline
    # Its end: the last frames, the talker's Final, the last PCM, then the record's end.
    end = [timeline[f"{stage}_ms"] for stage in ("last_frame", "talker_done", "last_pcm", "finished")]
    assert pieces[-1][0] <= end[0] and end == sorted(end), timeline


async def test_speech_sse_streams_deltas_then_done(stack):
    _, http, _, _ = stack
    audio, events = b"", []
    async with http.stream("POST", "/v1/audio/speech", json=speech(response_format="pcm", stream_format="sse")) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        async for line in s.aiter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                events.append(event["type"])
                if event["type"] == "speech.audio.delta":
                    audio += base64.b64decode(event["audio"])
    assert events[-1] == "speech.audio.done" and set(events[:-1]) == {"speech.audio.delta"}
    same = await http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    assert audio == same.content  # seeded: the SSE audio is the same as the plain stream's


async def test_unknown_voice_or_model_is_404_and_voices_and_models_list_the_talker(stack):
    _, http, _, _ = stack
    reply = await http.post("/v1/audio/speech", json=speech(voice="nobody"))
    assert reply.status_code == 404 and "voice" in reply.json()["error"]["message"]
    reply = await http.post("/v1/audio/speech", json=speech(model="tts-1"))
    assert reply.status_code == 404 and "model" in reply.json()["error"]["message"]
    voices = (await http.get("/v1/audio/voices")).json()
    assert "ryan" in voices["voices"] and "english" in voices["languages"]
    models = (await http.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == voices["model"]


async def test_grpc_speak_and_list_voices(stack):
    _, http, target, _ = stack
    async with grpc.aio.insecure_channel(target) as channel:
        stub = gateway_pb2_grpc.ChorusStub(channel)
        request = gateway_pb2.SpeakRequest(
            model="tiny", input="Hello there.", voice="ryan", language="english", seed=3, max_frames=30,
            response_format=gateway_pb2.AUDIO_FORMAT_PCM,
        )  # fmt: skip
        outputs = [output async for output in stub.Speak(request)]
        voices = await stub.ListVoices(gateway_pb2.VoiceListRequest())
    assert outputs[0].WhichOneof("output") == "request_id"
    assert outputs[-1].final.reason in (common_pb2.FINISH_REASON_EOS, common_pb2.FINISH_REASON_MAX_LENGTH)
    audio = b"".join(output.audio.data for output in outputs if output.HasField("audio"))
    same = await http.post("/v1/audio/speech", json=speech(input="Hello there.", response_format="pcm"))
    assert audio == same.content and len(audio) > 0
    assert "ryan" in [voice.name for voice in voices.voices]


@pytest.mark.parametrize("clone", [{"ref_text": "A tone."}, {"x_vector_only": True}])
async def test_voice_clone_from_a_base64_reference(stack, clone):
    _, http, _, _ = stack
    reference = base64.b64encode(reference_wav()).decode()
    reply = await http.post(
        "/v1/audio/speech", json=speech(voice=None, ref_audio=reference, response_format="wav") | clone
    )
    assert reply.status_code == 200, reply.text
    rate, samples = decode(reply.content)
    assert rate == SAMPLE_RATE_HZ and samples.size > 0


async def test_reference_codes_come_from_the_vocoder_and_are_cached(stack):
    gateway, _, _, vocoder = stack
    audio = reference_wav()
    cache = ReferenceCodes(gateway.context.backends)
    codes = await cache.codes(audio, "ref.0")
    async with grpc.aio.insecure_channel(vocoder) as channel:
        direct = await vocoder_pb2_grpc.VocoderStub(channel).Encode(vocoder_pb2.EncodeRequest(audio=audio))
    assert codes == direct.codes and codes.num_frames > 0
    for replica in gateway.context.backends.replicas["vocoder"]:
        replica.is_healthy = False  # a cache hit needs no vocoder
    assert await cache.codes(audio, "ref.1") is codes


async def test_grpc_speak_stream_forwards_text_deltas(stack):
    _, _, target, _ = stack
    first = gateway_pb2.SpeakRequest(
        model="tiny", input="Hello", voice="ryan", language="english", seed=3, max_frames=30,
        response_format=gateway_pb2.AUDIO_FORMAT_WAV,
    )  # fmt: skip
    messages = [
        gateway_pb2.SpeakInput(request=first),
        gateway_pb2.SpeakInput(text_delta=" there, how"),
        gateway_pb2.SpeakInput(text_delta=" are you?"),
        gateway_pb2.SpeakInput(end_of_input=True),
    ]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = gateway_pb2_grpc.ChorusStub(channel)
        outputs = [output async for output in stub.SpeakStream(iter(messages))]
        status = await stub.GetRequest(gateway_pb2.RequestRef(request_id=outputs[0].request_id))
    assert outputs[-1].final.reason in (common_pb2.FINISH_REASON_EOS, common_pb2.FINISH_REASON_MAX_LENGTH)
    rate, samples = decode(b"".join(output.audio.data for output in outputs if output.HasField("audio")))
    assert rate == SAMPLE_RATE_HZ and samples.size > 0
    assert status.state == gateway_pb2.REQUEST_STATE_DONE and status.usage.audio_s == samples.size / SAMPLE_RATE_HZ


async def test_grpc_speak_stream_refuses_a_second_request_message(stack):
    _, _, target, _ = stack
    first = gateway_pb2.SpeakRequest(model="tiny", input="Hello", voice="ryan", language="english", max_frames=30)
    messages = [gateway_pb2.SpeakInput(request=first), gateway_pb2.SpeakInput(request=first)]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = gateway_pb2_grpc.ChorusStub(channel)
        outputs = [output async for output in stub.SpeakStream(iter(messages))]
    final = outputs[-1].final
    assert final.reason == common_pb2.FINISH_REASON_ERROR and final.error.code == "INVALID_ARGUMENT"
    assert "text_delta" in final.error.message


async def test_a_slow_client_neither_holds_the_backends_nor_loses_audio(stack):
    gateway, http, _, _ = stack
    admission = gateway.context.admission.backends["talker"]
    received, is_run_over_while_reading = b"", False
    async with http.stream("POST", "/v1/audio/speech", json=speech(response_format="pcm")) as slow:
        request_id = slow.headers["x-request-id"]
        async for chunk in slow.aiter_raw(1024):
            received += chunk
            await asyncio.sleep(0.02)  # a client far slower than the tiny models
            if not is_run_over_while_reading:
                record = (await http.get(f"/v1/requests/{request_id}")).json()
                is_run_over_while_reading = record["status"] == "done" and admission.num_in_flight == 0
    # The output went to the capped journal in Redis; the slot was freed while the client still read.
    assert is_run_over_while_reading
    fast = await http.post("/v1/audio/speech", json=speech(response_format="pcm"))
    assert received == fast.content


@pytest.fixture
async def sdk(stack):
    gateway, _, _, _ = stack
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gateway.rest_port}/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


EXTENSIONS = {"language": "english", "seed": 3, "max_frames": 30}


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
async def test_openai_sdk_speech_create_in_every_format(sdk, response_format):
    reply = await sdk.audio.speech.create(
        model="tiny", voice="ryan", input="Hello there.", response_format=response_format, extra_body=EXTENSIONS
    )
    data = reply.content
    if response_format == "pcm":
        rate, samples = SAMPLE_RATE_HZ, np.frombuffer(data, dtype="<i2")
    else:
        rate, samples = decode(data)
    assert rate in (SAMPLE_RATE_HZ, 48_000) and samples.size / rate > 0


async def test_openai_sdk_streaming_response_chunk_by_chunk(sdk, stack):
    _, http, _, _ = stack
    chunks = []
    async with sdk.audio.speech.with_streaming_response.create(
        model="tiny", voice="ryan", input="Hello there.", response_format="pcm", extra_body=EXTENSIONS
    ) as response:
        async for chunk in response.iter_bytes():
            chunks.append(chunk)
    whole = await http.post("/v1/audio/speech", json=speech(input="Hello there.", response_format="pcm"))
    assert len(chunks) >= 1 and b"".join(chunks) == whole.content


async def test_openai_sdk_sse_stream_format(sdk):
    events = []
    async with sdk.audio.speech.with_streaming_response.create(
        model="tiny", voice="ryan", input="Hello there.", response_format="pcm", stream_format="sse",
        extra_body=EXTENSIONS,
    ) as response:  # fmt: skip
        async for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: "))["type"])
    assert events[-1] == "speech.audio.done" and events.count("speech.audio.delta") >= 1


async def test_resume_after_a_forced_disconnect_is_byte_identical(stack):
    _, http, _, _ = stack
    whole = await http.post("/v1/audio/speech", json=speech(response_format="mp3"))
    async with http.stream("POST", "/v1/audio/speech", json=speech(response_format="mp3")) as cut:
        request_id = cut.headers["x-request-id"]
        head = b""
        async for chunk in cut.aiter_raw(1000):
            head += chunk
            break  # the connection drops here
    rest = await http.get(f"/v1/requests/{request_id}/audio", params={"offset_bytes": len(head)})
    assert rest.status_code == 200 and 0 < len(head) < len(whole.content)
    assert head + rest.content == whole.content


async def test_a_full_talker_queue_reaches_the_client_as_429(start_gateway, redis_url, tmp_path):
    """The talker refuses what it cannot queue; several gateway processes, or one with a limit set above what the
    talker serves, can send it more than it holds."""
    talker = {"max_streams": 1, "max_queue": 0, "max_frames": 200}
    long_speech = speech(response_format="pcm", max_frames=200)
    async with (
        speech_stack(start_gateway, redis_url, str(tmp_path), talker, talker_max_in_flight=8) as (_, http, *_),
        http.stream("POST", "/v1/audio/speech", json=long_speech) as first,
    ):
        assert first.status_code == 200
        await anext(first.aiter_bytes())  # the talker's only slot is taken
        refused = await http.post("/v1/audio/speech", json=speech())
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"


async def test_a_requests_wait_for_admission_is_on_its_timeline(start_gateway, redis_url, tmp_path):
    """`arrived_ms`, negative: how long before its admission a request reached the gateway. With the only talker slot
    taken, a second request waits until the first is given up (its reader gone, then the detach grace)."""
    talker = {"max_frames": 200}
    async with speech_stack(start_gateway, redis_url, str(tmp_path), talker, talker_max_in_flight=1) as (_, http, *_):
        async with http.stream("POST", "/v1/audio/speech", json=speech(response_format="pcm", max_frames=200)) as first:
            assert first.status_code == 200
            await anext(first.aiter_bytes())
            waiting = asyncio.create_task(http.post("/v1/audio/speech", json=speech(response_format="pcm")))
            await asyncio.sleep(0.3)
            assert not waiting.done(), "the second request took a slot that was not free"
            first_id = first.headers["x-request-id"]
        second = await asyncio.wait_for(waiting, timeout=30)
        assert second.status_code == 200, second.text
        timelines = {}
        for request_id in (first_id, second.headers["x-request-id"]):
            for _ in range(100):  # the first run's record is written once its cancellation is done
                record = (await http.get(f"/v1/requests/{request_id}")).json()
                if record["timeline"] is not None:
                    break
                await asyncio.sleep(0.05)
            timelines[request_id] = record["timeline"]
    first_timeline, second_timeline = timelines.values()
    assert list(first_timeline)[:2] == ["arrived_ms", "admitted_ms"]
    assert -100 < first_timeline["arrived_ms"] <= 0, first_timeline
    assert second_timeline["arrived_ms"] <= -300, second_timeline

"""Resume after a forced disconnect: REST raw bytes, SSE Last-Event-ID and gRPC, byte-identical.

A producer task plays the part of the orchestration: it encodes real audio with the streaming
encoder and journals each chunk as it is made, while clients read, drop and reconnect.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json

import av
import grpc
import numpy as np

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.state.requests import DONE, FAILED, RUNNING
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


def speech_chunks(duration_s: float = 2.0) -> list[np.ndarray]:
    t = np.arange(int(24_000 * duration_s)) / 24_000
    samples = (0.4 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.array_split(samples, 24)  # ~83 ms each, like 12 Hz codec frames


async def produce(gateway, request_id: str, fail_after: int | None = None, delay_s: float = 0.02) -> bytes:
    """Journals an mp3 stream chunk by chunk; returns every byte it journaled."""
    requests, journal = gateway.context.requests, gateway.context.journal
    await requests.transition(request_id, RUNNING)
    encoder = StreamingEncoder("mp3", 24_000)
    sequence, sent = 0, b""
    for index, chunk in enumerate(speech_chunks()):
        if fail_after is not None and index == fail_after:
            error = {"code": "UNAVAILABLE", "message": "talker replica went away"}
            await requests.transition(request_id, FAILED, error=error, last_sequence=sequence - 1)
            await journal.finish(request_id, FAILED, error=error)
            return sent
        data = encoder.encode(chunk)
        if data:
            await journal.append(request_id, sequence, data)
            sequence, sent = sequence + 1, sent + data
        await asyncio.sleep(delay_s)
    data = encoder.flush()
    await journal.append(request_id, sequence, data)
    usage = {"audio_s": 2.0, "num_frames": 24}
    await requests.transition(request_id, DONE, usage=usage, last_sequence=sequence)
    await journal.finish(request_id, DONE, usage=usage)
    return sent + data


async def new_request(gateway) -> str:
    record = await gateway.context.requests.create("speech", model="qwen3-tts", voice="vivian", response_format="mp3")
    return record.request_id


async def test_raw_audio_resumes_by_byte_offset_byte_identical(start_gateway, redis_url):
    async with start_gateway(redis_url) as (gateway, client, _):
        request_id = await new_request(gateway)
        producer = asyncio.create_task(produce(gateway, request_id))
        received = b""
        async with client.stream("GET", f"/v1/requests/{request_id}/audio") as reply:
            assert reply.headers["content-type"] == "audio/mpeg"
            async for part in reply.aiter_raw():
                received += part
                if len(received) > 1000:
                    break  # the client drops the connection mid-stream
        assert not producer.done()
        resumed = await client.get(f"/v1/requests/{request_id}/audio", params={"offset_bytes": len(received)})
        journaled = await producer
        assert received + resumed.content == journaled
        uninterrupted = await client.get(f"/v1/requests/{request_id}/audio")
        assert uninterrupted.content == journaled
        with av.open(io.BytesIO(journaled)) as container:
            stream = container.streams.audio[0]
            num_samples = sum(frame.samples for frame in container.decode(stream))
            assert stream.codec_context.sample_rate == 24_000
        assert abs(num_samples / 24_000 - 2.0) < 0.1


async def test_sse_resumes_after_last_event_id(start_gateway, redis_url):
    async with start_gateway(redis_url) as (gateway, client, _):
        request_id = await new_request(gateway)
        producer = asyncio.create_task(produce(gateway, request_id))
        url = f"/v1/requests/{request_id}/audio?stream_format=sse"
        first_events = await read_sse(client, url, {}, max_events=3)
        last_id = first_events[-1]["id"]
        rest = await read_sse(client, url, {"Last-Event-ID": last_id})
        journaled = await producer
        deltas = [e for e in first_events + rest if e["data"]["type"] == "speech.audio.delta"]
        assert [int(e["id"]) for e in deltas] == list(range(len(deltas)))
        assert b"".join(base64.b64decode(e["data"]["audio"]) for e in deltas) == journaled
        assert rest[-1]["data"] == {"type": "speech.audio.done", "usage": {"audio_s": 2.0, "num_frames": 24}}


async def read_sse(client, url: str, headers: dict, max_events: int | None = None) -> list[dict]:
    events = []
    async with client.stream("GET", url, headers=headers) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        event: dict = {}
        async for line in reply.aiter_lines():
            if not line:
                events.append(event)
                event = {}
                if max_events is not None and len(events) == max_events:
                    break
                continue
            name, _, value = line.partition(": ")
            event[name] = json.loads(value) if name == "data" else value
    return events


async def test_grpc_resume_and_a_failure_mid_stream(start_gateway, redis_url):
    async with start_gateway(redis_url) as (gateway, client, grpc_target):
        request_id = await new_request(gateway)
        journaled = await produce(gateway, request_id, delay_s=0)
        async with grpc.aio.insecure_channel(grpc_target) as channel:
            stub = gateway_pb2_grpc.ChorusStub(channel)
            outputs = [o async for o in stub.Resume(gateway_pb2.ResumeRequest(request_id=request_id, after_sequence=4))]
            assert outputs[0].request_id == request_id
            assert [o.audio.sequence for o in outputs[1:-1]] == list(range(5, 5 + len(outputs) - 2))
            everything = [o async for o in stub.Resume(gateway_pb2.ResumeRequest(request_id=request_id))]
            assert b"".join(o.audio.data for o in everything[1:-1]) == journaled
            assert b"".join(o.audio.data for o in outputs[1:-1]) == b"".join(o.audio.data for o in everything[6:-1])
            assert outputs[-1].final.reason == common_pb2.FINISH_REASON_EOS

            failed_id = await new_request(gateway)
            await produce(gateway, failed_id, fail_after=10, delay_s=0)
            outputs = [o async for o in stub.Resume(gateway_pb2.ResumeRequest(request_id=failed_id))]
            assert outputs[-1].final.reason == common_pb2.FINISH_REASON_ERROR
            assert outputs[-1].final.error.message == "talker replica went away"
            status = await stub.GetRequest(gateway_pb2.RequestRef(request_id=failed_id))
            assert status.state == gateway_pb2.REQUEST_STATE_FAILED and status.error.code == "UNAVAILABLE"

        sse = await read_sse(client, f"/v1/requests/{failed_id}/audio?stream_format=sse", {})
        assert sse[-1]["event"] == "error" and sse[-1]["data"]["error"]["message"] == "talker replica went away"


async def test_resume_of_unknown_request_is_404_everywhere(start_gateway, redis_url):
    async with start_gateway(redis_url) as (_, client, grpc_target):
        reply = await client.get("/v1/requests/nope/audio")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "not_found"
        async with grpc.aio.insecure_channel(grpc_target) as channel:
            stub = gateway_pb2_grpc.ChorusStub(channel)
            try:
                _ = [o async for o in stub.Resume(gateway_pb2.ResumeRequest(request_id="nope"))]
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
            else:
                raise AssertionError("Resume of an unknown request succeeded")

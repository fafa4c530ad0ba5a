"""A client that stops reading pauses only its own request: its run stops `max_output_lead_s` of audio
ahead of what the client took (the journal stops growing), another request completes meanwhile, and
the stalled client then resumes the whole, byte-identical audio."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from speech_stack import speech_stack

from chorus.gateway.state import keys
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, talker_pb2_grpc

MAX_LEAD_S = 1.0
NUM_FRAMES = 100  # 8 s of audio at 12.5 Hz, 4 frames (0.32 s) per journaled chunk
NUM_BYTES = NUM_FRAMES * 1920 * 2  # pcm: 16-bit samples, 1920 per frame


def speech(**fields) -> dict:
    body = {"model": "tiny", "input": "Hello there.", "voice": "ryan", "language": "english", "seed": 5}
    return body | {"response_format": "pcm", "max_frames": NUM_FRAMES, "ignore_eos": True} | fields


@pytest.fixture
async def stack(start_gateway, redis_url, tmp_path):
    async with speech_stack(
        start_gateway, redis_url, str(tmp_path), {"max_frames": NUM_FRAMES}, max_output_lead_s=MAX_LEAD_S
    ) as stack:
        yield stack


async def journal_length_once_still(redis, request_id: str, still_s: float = 1.0) -> int:
    """The journal's length once it has not changed for `still_s` (the run has paused)."""
    length, num_still_polls = -1, 0
    for _ in range(100):
        await asyncio.sleep(0.1)
        now = await redis.xlen(keys.journal(request_id))
        num_still_polls = num_still_polls + 1 if now == length else 0
        length = now
        if num_still_polls * 0.1 >= still_s:
            return length
    raise AssertionError(f"the journal of {request_id} kept growing: {length} entries")


async def test_an_unread_run_pauses_at_the_bound_while_another_completes_then_resumes_whole(stack):
    gateway, http, _, talker_target, _ = stack
    gateway.context.runs.detach_grace_s = 30.0  # the stalled client comes back within this
    async with http.stream("POST", "/v1/audio/speech", json=speech()) as stalled:
        request_id = stalled.headers["x-request-id"]
        head = await anext(stalled.aiter_raw())
    # Nobody reads: the run may journal only MAX_LEAD_S beyond what the client took.
    paused_length = await journal_length_once_still(gateway.context.redis, request_id)
    assert (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "running"
    async with grpc.aio.insecure_channel(talker_target) as channel:
        load = await talker_pb2_grpc.TalkerStub(channel).GetLoad(common_pb2.GetLoadRequest())
    assert load.live_streams == 1  # paused, not ended: it holds its talker stream
    fast = asyncio.create_task(http.post("/v1/audio/speech", json=speech(), timeout=60))
    max_chunks_ahead = MAX_LEAD_S / 0.32 + 1
    assert paused_length <= len(head) / (4 * 1920 * 2) + max_chunks_ahead + 1 < NUM_FRAMES / 4
    fast = await fast
    assert fast.status_code == 200 and len(fast.content) == NUM_BYTES  # the other request was not held up
    assert await gateway.context.redis.xlen(keys.journal(request_id)) == paused_length

    rest = await http.get(f"/v1/requests/{request_id}/audio", params={"offset_bytes": len(head)}, timeout=60)
    assert rest.status_code == 200 and len(head + rest.content) == NUM_BYTES  # every frame, none twice
    whole = await http.get(f"/v1/requests/{request_id}/audio")
    assert head + rest.content == whole.content  # the resumed bytes are the journaled ones
    assert (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "done"


async def test_an_attached_client_that_reads_slowly_holds_its_run_at_the_bound(stack):
    gateway, http, target, talker_target, _ = stack
    request = gateway_pb2.SpeakRequest(
        model="tiny", input="Hello there.", voice="ryan", language="english", seed=5, max_frames=NUM_FRAMES,
        ignore_eos=True, response_format=gateway_pb2.AUDIO_FORMAT_PCM,
    )  # fmt: skip
    # A small, fixed HTTP/2 window: an unread response backs up into the gateway at once.
    window = [("grpc.http2.lookahead_bytes", 16 * 1024), ("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(target, options=window) as channel:
        call = gateway_pb2_grpc.ChorusStub(channel).Speak(request)
        request_id = (await call.read()).request_id
        audio = (await call.read()).audio.data
        paused_length = await journal_length_once_still(gateway.context.redis, request_id)
        assert paused_length < NUM_FRAMES / 4
        async with grpc.aio.insecure_channel(talker_target) as talker:
            load = await talker_pb2_grpc.TalkerStub(talker).GetLoad(common_pb2.GetLoadRequest())
        assert load.live_streams == 1
        while (output := await call.read()) is not grpc.aio.EOF:  # now the client reads on, slowly
            audio += output.audio.data
            final = output.final
            await asyncio.sleep(0.01)
    assert final.reason == common_pb2.FINISH_REASON_EOS and len(audio) == NUM_BYTES  # done, every frame
    assert (await http.get(f"/v1/requests/{request_id}/audio")).content == audio  # as journaled

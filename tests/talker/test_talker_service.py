"""`Talker.Synthesize` / `GetLoad` / `ListVoices` over a real gRPC server on loopback with the tiny talker."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from chorus.runtime.host import ServiceHost
from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService, TalkerServicer
from chorus.v1 import common_pb2, talker_pb2, talker_pb2_grpc
from chorus.wire import chunk_to_codes, codes_to_chunk

GREEDY = talker_pb2.SamplingParams(greedy=True)


@pytest.fixture
async def talker(tmp_path):
    config = TalkerConfig(
        device="cpu", metrics_port=-1, max_streams=4, max_queue=2, chunk_frames=4, max_frames=40, grace_s=1.0,
        cache_dir=str(tmp_path), use_cuda_graphs=False,
    )  # fmt: skip
    service = TalkerService(config)
    host = ServiceHost(config, service)
    await host.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        yield talker_pb2_grpc.TalkerStub(channel), service
    await host.stop()


def request(**fields) -> talker_pb2.SynthesizeInput:
    fields = {"text": "Hello there, how are you?", "speaker": "ryan", "language": "english", **fields}
    return talker_pb2.SynthesizeInput(request=talker_pb2.SynthesisRequest(**fields))


async def synthesize(stub, *messages):
    outputs = [m async for m in stub.Synthesize(iter(messages))]
    chunks = [m.chunk for m in outputs[:-1]]
    return chunks, outputs[-1].final


async def test_chunks_grow_from_one_frame_to_the_configured_size(talker):
    stub, _ = talker
    chunks, final = await synthesize(stub, request(seed=5, max_frames=30, ignore_eos=True, chunk_frames=6))
    assert [c.num_frames for c in chunks] == [1, 2, 4, 6, 6, 6, 5]
    assert [c.sequence for c in chunks] == [0, 1, 2, 3, 4, 5, 6]
    assert [c.frame_offset for c in chunks] == [0, 1, 3, 7, 13, 19, 25]
    assert final.reason == common_pb2.FINISH_REASON_MAX_LENGTH
    assert final.usage.num_frames == 30 and final.usage.audio_s == pytest.approx(30 * 0.08)
    assert final.usage.timings.total_ms >= final.usage.timings.first_output_ms > 0


async def test_a_seed_gives_the_same_codes_alone_and_beside_other_requests(talker):
    stub, _ = talker
    target = request(seed=11, max_frames=12, chunk_frames=3)
    alone, _ = await synthesize(stub, target)
    others = [synthesize(stub, request(text=f"Another one number {i}.", seed=i, max_frames=12)) for i in range(3)]
    together = await asyncio.gather(synthesize(stub, target), *others)
    codes_alone = np.concatenate([chunk_to_codes(c) for c in alone])
    codes_together = np.concatenate([chunk_to_codes(c) for c in together[0][0]])
    np.testing.assert_array_equal(codes_together, codes_alone)
    assert codes_alone.shape[1] == 16 and codes_alone.min() >= 0 and codes_alone.max() < 2048


async def test_streaming_text_deltas_match_the_whole_text(talker):
    stub, _ = talker
    whole, _ = await synthesize(stub, request(text="Hello there, how are you?", sampling=GREEDY, max_frames=10,
                                              streaming_text=True))  # fmt: skip
    deltas, _ = await synthesize(
        stub,
        request(text="Hello", sampling=GREEDY, max_frames=10, streaming_text=True),
        talker_pb2.SynthesizeInput(text_delta=" there,"),
        talker_pb2.SynthesizeInput(text_delta=" how are you?"),
        talker_pb2.SynthesizeInput(end_of_input=True),
    )
    np.testing.assert_array_equal(
        np.concatenate([chunk_to_codes(c) for c in deltas]), np.concatenate([chunk_to_codes(c) for c in whole])
    )


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        (request(speaker="nobody"), "speaker"),
        (request(language="klingon"), "language"),
        (request(max_frames=100000), "max_frames"),
        (request(sampling=talker_pb2.SamplingParams(top_p=1.5)), "top_p"),
        (request(task_type=talker_pb2.TASK_TYPE_VOICE_CLONE), "ref_audio"),
        (talker_pb2.SynthesizeInput(text_delta="hi"), "the first message must be `request`"),
        (
            request(prefix_frames=common_pb2.CodecChunk(codes=bytes(10), num_frames=3, num_codebooks=16)),
            "prefix_frames: 10 bytes of codes do not hold 3 frames × 16 codebooks",
        ),
        (request(prefix_frames=codes_to_chunk(np.zeros((3, 8)), 0, 0)), "prefix_frames: must be [frames, 16]"),
        (request(prefix_frames=codes_to_chunk(np.full((3, 16), 4000), 0, 0)), "prefix_frames: codes must be in"),
        (
            request(max_frames=20, prefix_frames=codes_to_chunk(np.zeros((21, 16)), 0, 0)),
            "prefix_frames: 21 frames exceed max_frames (20)",
        ),
        (request(prefix_frames=codes_to_chunk(np.zeros((3, 16)), 0, 0)), "seed: resuming a sampled request"),
    ],
)
async def test_bad_requests_get_invalid_argument_naming_the_field(talker, message, detail):
    stub, _ = talker
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await synthesize(stub, message)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in failure.value.details()


def _codes(chunks) -> np.ndarray:
    return np.concatenate([chunk_to_codes(c) for c in chunks]) if chunks else np.zeros((0, 16), dtype=np.int64)


@pytest.mark.parametrize(
    ("sampling", "ignore_eos", "reason"),
    [
        (talker_pb2.SamplingParams(repetition_penalty=1.3), True, common_pb2.FINISH_REASON_MAX_LENGTH),
        (talker_pb2.SamplingParams(greedy=True), False, common_pb2.FINISH_REASON_EOS),
    ],
)
async def test_a_stream_broken_after_any_chunk_resumes_on_a_new_call_exactly(talker, sampling, ignore_eos, reason):
    stub, _ = talker
    first = request(text="Resume me where I stopped.", seed=3, sampling=sampling, max_frames=24, chunk_frames=4,
                    ignore_eos=ignore_eos)  # fmt: skip
    full_chunks, full_final = await synthesize(stub, first)
    full = _codes(full_chunks)
    assert len(full) >= 4 and full_final.reason == reason
    for num_chunks in range(len(full_chunks) + 1):
        # The replica "dies" after `num_chunks` chunks: the gateway keeps what arrived and reopens the stream.
        call = stub.Synthesize(iter([first]))
        received = [(await call.read()).chunk for _ in range(num_chunks)]
        call.cancel()
        prefix = _codes(received)
        resumed = talker_pb2.SynthesizeInput()
        resumed.CopyFrom(first)
        resumed.request.prefix_frames.CopyFrom(codes_to_chunk(prefix, 0, 0))
        chunks, final = await synthesize(stub, resumed)
        np.testing.assert_array_equal(np.concatenate([prefix, _codes(chunks)]), full)
        assert [c.sequence for c in chunks] == list(range(len(chunks)))
        offsets = np.cumsum([len(prefix)] + [c.num_frames for c in chunks])
        assert [c.frame_offset for c in chunks] == offsets[:-1].tolist()
        assert final.reason == full_final.reason
        assert final.usage.num_frames == len(full) - len(prefix), "usage counts this stream's frames"


async def test_a_resumed_streaming_text_stream_takes_the_deltas_again(talker):
    stub, _ = talker
    deltas = [talker_pb2.SynthesizeInput(text_delta=piece) for piece in (" there,", " how are you?")]
    end = talker_pb2.SynthesizeInput(end_of_input=True)
    first = request(text="Hello", seed=4, max_frames=16, streaming_text=True, ignore_eos=True)
    full = _codes((await synthesize(stub, first, *deltas, end))[0])
    resumed = talker_pb2.SynthesizeInput()
    resumed.CopyFrom(first)
    resumed.request.prefix_frames.CopyFrom(codes_to_chunk(full[:5], 0, 0))
    chunks, final = await synthesize(stub, resumed, *deltas, end)
    np.testing.assert_array_equal(_codes(chunks), full[5:])
    assert chunks[0].frame_offset == 5 and final.reason == common_pb2.FINISH_REASON_MAX_LENGTH


async def test_cancelling_neighbours_mid_stream_leaves_a_seeded_stream_unchanged(talker):
    stub, _ = talker
    survivors = [request(text=f"Survivor number {i}.", seed=20 + i, max_frames=24, ignore_eos=True, chunk_frames=2)
                 for i in range(2)]  # fmt: skip
    alone = [_codes((await synthesize(stub, message))[0]) for message in survivors]
    doomed = [stub.Synthesize(iter([request(text=f"Cancelled {i}.", seed=i, max_frames=24, ignore_eos=True,
                                            chunk_frames=1)])) for i in range(2)]  # fmt: skip
    together = asyncio.gather(*(synthesize(stub, message) for message in survivors))
    for call in doomed:  # cancelled after a few frames, while the survivors decode beside them
        for _ in range(3):
            await call.read()
        call.cancel()
    newcomers = [synthesize(stub, request(text=f"Newcomer {i}.", seed=30 + i, max_frames=12)) for i in range(2)]
    results = await asyncio.gather(together, *newcomers)
    for codes, (chunks, final) in zip(alone, results[0], strict=True):
        np.testing.assert_array_equal(_codes(chunks), codes)
        assert final.reason == common_pb2.FINISH_REASON_MAX_LENGTH


async def test_cancelling_the_call_frees_the_slot(talker):
    stub, _ = talker
    call = stub.Synthesize(iter([request(max_frames=40, ignore_eos=True, chunk_frames=1)]))
    assert (await call.read()).chunk.num_frames == 1
    assert (await stub.GetLoad(common_pb2.GetLoadRequest())).live_streams == 1
    call.cancel()
    for _ in range(200):
        load = await stub.GetLoad(common_pb2.GetLoadRequest())
        if load.live_streams == 0:
            break
        await asyncio.sleep(0.02)
    assert load.live_streams == 0 and load.free_slots == 4


async def test_a_cancel_of_the_call_while_it_stops_its_text_feeder_is_not_swallowed(talker):
    _, service = talker
    call: asyncio.Task | None = None

    async def messages():
        yield request(request_id="cancelled-at-the-end", max_frames=2, ignore_eos=True, streaming_text=True)
        try:
            await asyncio.Event().wait()  # the client sends no more text, nor its end
        except asyncio.CancelledError:
            call.cancel()  # the client goes away as the call, its frames made, stops the feeder
            raise

    async def synthesize() -> list:
        return [output async for output in TalkerServicer(service).Synthesize(messages(), context=None)]

    call = asyncio.create_task(synthesize())
    async with asyncio.timeout(10):
        await asyncio.wait([call])
    assert call.cancelled(), "before the fix the call swallowed its cancel and went on to send its Final"


async def test_list_voices_reports_the_checkpoint(talker):
    stub, _ = talker
    voices = await stub.ListVoices(talker_pb2.ListVoicesRequest())
    assert "ryan" in voices.speakers and "english" in voices.languages
    assert talker_pb2.TASK_TYPE_CUSTOM_VOICE in voices.task_types

"""`Vocoder.Decode` / `Encode` / `GetLoad` over a real gRPC server on loopback with the tiny codec."""

from __future__ import annotations

import asyncio
import gc

import grpc
import numpy as np
import pytest
import torch
from vocoder_helpers import until_no_live_streams

from chorus.runtime.host import ServiceHost
from chorus.v1 import common_pb2, vocoder_pb2, vocoder_pb2_grpc
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.engine.engine import StreamEnded
from chorus.vocoder.service import VocoderService, VocoderServicer
from chorus.wire import chunk_to_codes, chunk_to_pcm, codes_to_chunk

F32 = common_pb2.SAMPLE_FORMAT_PCM_F32LE


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    generator = np.random.default_rng(7)
    return generator.integers(0, 2048, size=(40, 16))


@pytest.fixture
async def vocoder():
    config = VocoderConfig(device="cpu", metrics_port=-1, max_streams=4, grace_s=1.0)
    service = VocoderService(config)
    host = ServiceHost(config, service)
    await host.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
        yield vocoder_pb2_grpc.VocoderStub(channel), service
    await host.stop()


def decode_messages(codes: np.ndarray, chunk_sizes: list[int], sample_format=F32, request_id="req-1"):
    yield vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen(request_id=request_id, format=sample_format))
    offset = 0
    for sequence, size in enumerate(chunk_sizes):
        chunk = codes_to_chunk(codes[offset : offset + size], sequence=sequence, frame_offset=offset)
        yield vocoder_pb2.DecodeInput(chunk=chunk)
        offset += size
    yield vocoder_pb2.DecodeInput(end_of_input=True)


def one_shot(service: VocoderService, codes: np.ndarray) -> np.ndarray:
    decoder = service.engine.runner.decoder
    with torch.no_grad():
        waveform, _ = decoder(torch.from_numpy(codes)[None], decoder.new_state(1))
    return waveform[0].numpy()


async def test_streamed_decode_over_grpc_equals_one_shot_decode(vocoder, codes):
    stub, service = vocoder
    outputs = [message async for message in stub.Decode(decode_messages(codes, [1, 25, 14]))]
    pcm = [m.pcm for m in outputs[:-1]]
    assert [chunk.sequence for chunk in pcm] == list(range(len(pcm)))
    assert pcm[0].sample_offset == 0 and pcm[0].sample_rate_hz == 24000 and pcm[0].num_channels == 1
    samples = np.concatenate([chunk_to_pcm(chunk)[:, 0] for chunk in pcm])
    assert samples.shape == (40 * 1920,)
    np.testing.assert_allclose(samples, one_shot(service, codes), atol=1e-5)
    final = outputs[-1].final
    assert final.reason == common_pb2.FINISH_REASON_COMPLETE
    assert final.usage.num_frames == 40 and final.usage.audio_s == pytest.approx(40 * 0.08)
    await asyncio.sleep(0)
    assert service.engine.stats().live_streams == 0


async def test_int16_output_is_the_clipped_float_output(vocoder, codes):
    stub, service = vocoder
    outputs = [m async for m in stub.Decode(decode_messages(codes[:5], [5], common_pb2.SAMPLE_FORMAT_PCM_S16LE))]
    samples = np.concatenate([chunk_to_pcm(m.pcm)[:, 0] for m in outputs[:-1]])
    expected = (np.clip(one_shot(service, codes[:5]), -1, 1) * 32767).round().astype(np.int16)
    assert samples.dtype == np.int16 and np.abs(samples.astype(int) - expected).max() <= 1


@pytest.mark.parametrize(
    ("messages", "detail"),
    [
        ([vocoder_pb2.DecodeInput(end_of_input=True)], "the first message must be `open`"),
        (
            [
                vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen()),
                vocoder_pb2.DecodeInput(chunk=common_pb2.CodecChunk(codes=b"\x00" * 5, num_frames=1, num_codebooks=16)),
            ],
            "do not hold 1 frames",
        ),
        (
            [
                vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen()),
                vocoder_pb2.DecodeInput(chunk=codes_to_chunk(np.full((1, 16), 5000), 0, 0)),
            ],
            "codes must be in [0, 2048)",
        ),
        (
            [
                vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen()),
                vocoder_pb2.DecodeInput(chunk=codes_to_chunk(np.zeros((1, 16)), 0, frame_offset=7)),
            ],
            "chunk.frame_offset: expected 0",
        ),
        (
            [
                vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen()),
                vocoder_pb2.DecodeInput(chunk=codes_to_chunk(np.zeros((3, 16)), 0, 0)),
            ],  # then a half-close: as a cancelled call looks to the service
            "ended without `end_of_input`",
        ),
    ],
)
async def test_bad_streams_get_invalid_argument_and_free_their_state(vocoder, messages, detail):
    stub, service = vocoder
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        _ = [m async for m in stub.Decode(iter(messages))]
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert detail in failure.value.details()
    await until_no_live_streams(service.engine)


async def test_a_cancelled_call_frees_its_stream(vocoder, codes):
    stub, service = vocoder
    requests: asyncio.Queue = asyncio.Queue()

    async def messages():
        while (message := await requests.get()) is not None:
            yield message

    call = stub.Decode(messages())
    await requests.put(vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen(format=F32)))
    await requests.put(vocoder_pb2.DecodeInput(chunk=codes_to_chunk(codes[:3], 0, 0)))
    first = await call.read()
    assert first.pcm.sample_offset == 0
    assert service.engine.stats().live_streams == 1
    call.cancel()
    await until_no_live_streams(service.engine)


@pytest.mark.parametrize("ending", ["client gone", "call cancelled", "stream abandoned"])
async def test_the_feeder_ends_with_the_call(codes, ending):
    config = VocoderConfig(device="cpu", metrics_port=-1, max_streams=4, grace_s=1.0, idle_timeout_s=1.0)
    service = VocoderService(config)
    host = ServiceHost(config, service)
    await host.start()
    source_closed = asyncio.Event()

    async def messages():
        yield vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen(request_id=ending, format=F32))
        yield vocoder_pb2.DecodeInput(chunk=codes_to_chunk(codes[:3], 0, 0))
        try:
            await asyncio.Event().wait()  # the client sends no more frames, nor its end
        finally:
            await asyncio.sleep(0.1)  # a request stream takes a moment to close
            source_closed.set()

    outputs = VocoderServicer(service).Decode(messages(), context=None)

    async def consume() -> None:
        async for _ in outputs:
            if ending == "client gone":
                await outputs.aclose()
                return
            if ending == "call cancelled":
                asyncio.current_task().cancel()

    try:
        call = asyncio.create_task(consume())
        async with asyncio.timeout(10):
            await asyncio.wait([call])
        if ending == "call cancelled":
            assert call.cancelled()
        elif ending == "stream abandoned":  # nobody sent nor read for idle_timeout_s: the engine freed it
            assert isinstance(call.exception(), StreamEnded)
        else:
            assert call.result() is None
        assert source_closed.is_set(), "before the fix the feeder was cancelled, not awaited: it outlived the call"
    finally:
        await host.stop()


async def test_a_cancel_of_the_call_while_it_stops_its_feeder_is_not_swallowed(codes):
    config = VocoderConfig(device="cpu", metrics_port=-1, max_streams=4, grace_s=1.0, idle_timeout_s=1.0)
    service = VocoderService(config)
    host = ServiceHost(config, service)
    await host.start()
    call: asyncio.Task | None = None

    async def messages():
        yield vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen(request_id="cancelled-at-the-end", format=F32))
        yield vocoder_pb2.DecodeInput(chunk=codes_to_chunk(codes[:3], 0, 0))
        try:
            await asyncio.Event().wait()  # the client sends no more frames, nor its end
        except asyncio.CancelledError:
            call.cancel()  # the client goes away as the call, its stream abandoned, stops the feeder
            raise

    async def decode() -> list:
        return [output async for output in VocoderServicer(service).Decode(messages(), context=None)]

    try:
        call = asyncio.create_task(decode())
        async with asyncio.timeout(10):
            await asyncio.wait([call])
        assert call.cancelled(), "a cancel landing while the feeder stops must not turn into StreamEnded"
    finally:
        await host.stop()


async def test_encode_returns_codes_and_get_load_reports_slots(vocoder):
    stub, _ = vocoder
    import io

    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=16000, layout="mono")
        tone = (np.sin(np.arange(16000) * 2 * np.pi * 220 / 16000) * 8000).astype(np.int16)[None]
        frame = av.AudioFrame.from_ndarray(tone, format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    reply = await stub.Encode(vocoder_pb2.EncodeRequest(audio=buffer.getvalue()))  # 1 s → ceil(12.5) frames
    codes = chunk_to_codes(reply.codes)
    assert codes.shape == (13, 16) and reply.audio_s == pytest.approx(1.0)
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await stub.Encode(vocoder_pb2.EncodeRequest(audio=b"not audio"))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    load = await stub.GetLoad(common_pb2.GetLoadRequest())
    assert load.live_streams == 0 and load.free_slots == 4


async def test_a_call_given_up_after_its_input_ended_leaves_no_unretrieved_error(codes, caplog):
    """A cancelled call's input ends first (its feeder then fails: no `end_of_input`), then the handler is closed
    where it yielded: the feeder's error must be retrieved there, not logged as "Task exception was never
    retrieved" at garbage collection for every client that went away."""
    config = VocoderConfig(device="cpu", metrics_port=-1, max_streams=4, grace_s=1.0)
    service = VocoderService(config)
    host = ServiceHost(config, service)
    await host.start()
    first_read = asyncio.Event()

    async def messages():
        yield vocoder_pb2.DecodeInput(open=vocoder_pb2.DecodeOpen(request_id="gone", format=F32))
        yield vocoder_pb2.DecodeInput(chunk=codes_to_chunk(codes[:3], 0, 0))
        await first_read.wait()  # then the input ends

    try:
        async with asyncio.timeout(10):
            outputs = VocoderServicer(service).Decode(messages(), context=None)
            assert (await anext(outputs)).WhichOneof("output") == "pcm"
            first_read.set()
            await until_no_live_streams(service.engine)  # the feeder failed and closed the stream
            await outputs.aclose()  # the call is given up where it yielded
            gc.collect()
            await asyncio.sleep(0)
    finally:
        await host.stop()
    assert "never retrieved" not in caplog.text

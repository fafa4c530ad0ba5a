"""One speech segment through the backends: talker stream → vocoder stream, chunk by chunk.

Codec chunks are forwarded to the vocoder as the talker makes them, and PCM is yielded as the
vocoder decodes it, so the first audio leaves after the first frames, not after the segment.
Both upstream calls belong to the segment: when the consumer stops (client gone, cancel, an
error elsewhere) both are cancelled before this generator returns, which frees their slots.
A `Final` carrying an error from either backend ends the segment with `Unavailable`.

Written against the contracts in protos/chorus/v1/{talker,vocoder}.proto.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from chorus.runtime.errors import ChorusError, InvalidRequest, Overloaded, Unavailable
from chorus.runtime.logs import REQUEST_ID_HEADER
from chorus.v1 import common_pb2, talker_pb2, talker_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc


def check_final(final: common_pb2.Final, backend: str) -> None:
    if final.reason != common_pb2.FINISH_REASON_ERROR:
        return
    if final.error.code == grpc.StatusCode.INVALID_ARGUMENT.name:
        raise InvalidRequest(f"{backend}: {final.error.message}")
    if final.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.name:
        raise Overloaded(f"{backend}: {final.error.message}")
    raise Unavailable(f"{backend} failed: {final.error.message or final.error.code}")


def upstream_error(exc: grpc.aio.AioRpcError, backend: str) -> ChorusError:
    """A backend's refusal as the client's error: its bad-request and full-queue answers pass through (400, 429;
    a full queue behind this gateway happens when several gateway workers or replicas share one backend)."""
    if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(f"{backend}: {exc.details()}")
    if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Overloaded(f"{backend}: {exc.details()}")
    return Unavailable(f"{backend} failed: {exc.code().name}: {exc.details()}")


class SegmentResult:
    """What a finished segment reports: the talker's Final (usage, reason)."""

    def __init__(self) -> None:
        self.talker_final: common_pb2.Final | None = None


async def synthesize_segment(
    talker: talker_pb2_grpc.TalkerStub,
    vocoder: vocoder_pb2_grpc.VocoderStub,
    request: talker_pb2.SynthesisRequest,
    result: SegmentResult | None = None,
    timeout_s: float | None = None,
    text_deltas: AsyncIterator[str] | None = None,
) -> AsyncIterator[common_pb2.PcmChunk]:
    """PCM chunks for `request.text`, as soon as the vocoder makes them.

    With `text_deltas` (and `request.streaming_text`), more text follows the request while audio
    already streams back: each delta goes to the talker as it arrives, then `end_of_input`.
    """
    metadata = ((REQUEST_ID_HEADER, request.request_id),)
    talker_call = talker.Synthesize(timeout=timeout_s, metadata=metadata)
    vocoder_call = vocoder.Decode(timeout=timeout_s, metadata=metadata)
    result = result or SegmentResult()

    async def forward_codes() -> None:
        """Talker → vocoder; runs beside the PCM reader so decoding overlaps generation."""
        writer = asyncio.create_task(write_text(), name=f"text-{request.request_id}")
        try:
            async for output in talker_call:
                if output.WhichOneof("output") == "chunk":
                    await vocoder_call.write(vocoder_pb2.DecodeInput(chunk=output.chunk))
                else:
                    check_final(output.final, "talker")
                    result.talker_final = output.final
            await writer  # surfaces a bad delta stream (the talker ended on our half-close)
            await vocoder_call.write(vocoder_pb2.DecodeInput(end_of_input=True))
            await vocoder_call.done_writing()
        except grpc.aio.AioRpcError as exc:
            raise upstream_error(exc, "talker") from None
        finally:
            writer.cancel()

    async def write_text() -> None:
        await talker_call.write(talker_pb2.SynthesizeInput(request=request))
        if text_deltas is not None:
            try:
                async for delta in text_deltas:
                    await talker_call.write(talker_pb2.SynthesizeInput(text_delta=delta))
            except ChorusError:
                await talker_call.done_writing()  # the talker ends with the text it has; `await writer` re-raises
                raise
            await talker_call.write(talker_pb2.SynthesizeInput(end_of_input=True))
        await talker_call.done_writing()

    forwarder: asyncio.Task | None = None
    try:
        open_message = vocoder_pb2.DecodeOpen(request_id=request.request_id, format=common_pb2.SAMPLE_FORMAT_PCM_F32LE)
        await vocoder_call.write(vocoder_pb2.DecodeInput(open=open_message))
        forwarder = asyncio.create_task(forward_codes(), name=f"codes-{request.request_id}")
        reader = aiter(vocoder_call)
        while True:
            next_output = asyncio.ensure_future(anext(reader, None))
            # Whichever ends first: the next PCM chunk, or the forwarder failing (talker error).
            done, _ = await asyncio.wait({next_output, forwarder}, return_when=asyncio.FIRST_COMPLETED)
            if forwarder in done and forwarder.exception() is not None:
                next_output.cancel()
                raise forwarder.exception()
            try:
                output = await next_output
            except grpc.aio.AioRpcError as exc:
                raise upstream_error(exc, "vocoder") from None
            if output is None:
                raise Unavailable("vocoder ended the stream without a Final")
            if output.WhichOneof("output") == "pcm":
                yield output.pcm
                continue
            check_final(output.final, "vocoder")
            await forwarder  # the talker's Final was read before the vocoder could finish
            return
    finally:
        if forwarder is not None:
            forwarder.cancel()
            with contextlib.suppress(asyncio.CancelledError, ChorusError):
                await forwarder
        talker_call.cancel()
        vocoder_call.cancel()

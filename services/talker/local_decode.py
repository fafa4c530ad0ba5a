"""A talker stream that carries its audio too: the vocoder of the same process decodes its frames
(`SynthesisRequest.decode`, `chorus serve speech`).

Through the gateway, every chunk takes three messages in the speech process (the talker's chunk out, the same
frames back in on a vocoder stream, their PCM out) and every segment two calls. Here the frames go from the talker's
stream straight into a decode stream of the vocoder beside it, and the caller gets the chunk (it keeps the frames
for a fail-over) and then its PCM on the one stream: two messages a chunk, one call a segment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import numpy as np

from chorus.runtime.errors import InvalidRequest, NotImplementedYet
from chorus.runtime.tasks import cancel_and_wait
from chorus.v1 import common_pb2, talker_pb2
from chorus.wire import chunk_to_codes, pcm_to_chunk

MAX_QUEUED_OUTPUTS = 16  # messages made but not yet sent: beyond it the talker's and vocoder's sides wait
_END = object()


def delivered_prefix(request: talker_pb2.SynthesisRequest) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(the prefix frames whose audio was delivered, those whose audio is still owed) of a fail-over's request."""
    prefix = chunk_to_codes(request.prefix_frames, "prefix_frames") if request.prefix_frames.num_frames else None
    num_delivered = request.decode.num_delivered_frames
    num_prefix = 0 if prefix is None else len(prefix)
    if num_delivered > num_prefix:
        raise InvalidRequest(
            f"decode.num_delivered_frames: {num_delivered} is more than the {num_prefix} prefix_frames sent"
        )
    if prefix is None:
        return None, None
    return (prefix[:num_delivered] if num_delivered else None), (
        prefix[num_delivered:] if num_delivered < num_prefix else None
    )


async def with_audio(
    chunks: AsyncIterator[common_pb2.CodecChunk], vocoder, request: talker_pb2.SynthesisRequest
) -> AsyncIterator[talker_pb2.SynthesizeOutput]:
    """Each of `chunks` as an output, and the PCM of its frames after it, decoded by `vocoder` (the process's
    VocoderService; None: this talker has none beside it)."""
    if vocoder is None:
        raise NotImplementedYet(
            "decode: this talker has no vocoder in its process (serve both with `chorus serve speech`)"
        )
    engine = vocoder.require_engine()
    context, owed = delivered_prefix(request)
    sample_format = request.decode.format or common_pb2.SAMPLE_FORMAT_PCM_S16LE
    sample_rate_hz = engine.runner.decoder.config.output_sample_rate_hz
    outputs: asyncio.Queue = asyncio.Queue(MAX_QUEUED_OUTPUTS)

    async def frames_in(decoding) -> None:
        if owed is not None:
            await decoding.send(owed)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                await outputs.put(talker_pb2.SynthesizeOutput(chunk=chunk))  # before its audio: the caller logs it
                await decoding.send(chunk_to_codes(chunk))
        decoding.end_input()

    async def audio_out(decoding) -> None:
        sequence = 0
        async for piece in decoding:
            chunk = pcm_to_chunk(piece.waveform, sample_rate_hz, sample_format, sequence, piece.sample_offset)
            await outputs.put(talker_pb2.SynthesizeOutput(pcm=chunk))
            sequence += 1
        await outputs.put(_END)

    async with engine.open_stream(request.request_id, context) as decoding:
        sides = [asyncio.create_task(frames_in(decoding)), asyncio.create_task(audio_out(decoding))]
        try:
            while (output := await _next(outputs, sides)) is not _END:
                yield output
        finally:
            # Both end with the stream: a side left behind would still read the talker's frames or the vocoder's
            # audio after the call ended. What ended it is raised; their own errors are read and dropped.
            await cancel_and_wait(sides, "local decode")
            for side in sides:
                if side.done() and not side.cancelled():
                    side.exception()


async def _next(outputs: asyncio.Queue, sides: list[asyncio.Task]):
    """The next queued output; raises the error of a side that failed meanwhile (the other then waits forever)."""
    getting = asyncio.ensure_future(outputs.get())
    try:
        while True:
            waiting = {getting} | {side for side in sides if not side.done()}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if getting in done:
                return getting.result()
            for side in done:
                if side.exception() is not None:
                    raise side.exception()
    finally:
        if not getting.done():
            await cancel_and_wait([getting], "output read")

"""One speech segment through the backends: talker stream → vocoder stream, chunk by chunk, surviving replicas.

Codec chunks go on to the vocoder as the talker makes them, and PCM is yielded as the vocoder decodes it,
so the first audio leaves after the first frames, not after the segment. The two streams meet in the
segment's `FrameLog`, which keeps every frame: when a talker replica fails mid-stream, another one is sent
the request plus the frames so far (`prefix_frames`) and continues with the frames an uninterrupted run
would have made (sampling is a function of seed and frame index); when a vocoder replica fails, another one
is primed with the frames whose audio was already yielded (`context_codes`) and decodes the rest, so the
audio has no gap and no repeat (see `failover`). Both upstream calls belong to the segment: when the
consumer stops (client gone, cancel, an error elsewhere) both are cancelled, and the tasks feeding them ended,
before this generator returns.

Written against the contracts in protos/chorus/v1/{talker,vocoder}.proto.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator

import grpc

from chorus.gateway.failover import (
    DEFAULT_POLICY,
    FailoverPolicy,
    Failovers,
    ReplicaFailed,
    ReplicaSource,
    await_status,
    check_final_for_failover,
    failure_of,
    next_message,
)
from chorus.gateway.frame_log import FrameLog
from chorus.runtime.errors import ChorusError, InvalidRequest, Overloaded, Unavailable
from chorus.runtime.logs import REQUEST_ID_HEADER
from chorus.runtime.tasks import cancel_and_drop, cancel_and_join
from chorus.v1 import common_pb2, talker_pb2, vocoder_pb2

CODEC_FRAME_RATE_HZ = 12.5  # the Qwen3-TTS 12 Hz codec: sample rate / 12.5 samples per frame


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


def _raise_for(exc: grpc.aio.AioRpcError, backend: str) -> None:
    raise failure_of(exc, backend) or upstream_error(exc, backend) from None


class _TextFeed:
    """Streaming-text deltas, kept as sent so that a replacement talker stream gets them all again."""

    def __init__(self, deltas: AsyncIterator[str] | None) -> None:
        self._deltas = deltas
        self._sent: list[str] = []

    async def deltas(self) -> AsyncIterator[str]:
        for delta in list(self._sent):
            yield delta
        if self._deltas is not None:
            async for delta in self._deltas:
                self._sent.append(delta)
                yield delta


class SegmentPipeline:
    def __init__(
        self,
        source: ReplicaSource,
        request: talker_pb2.SynthesisRequest,
        policy: FailoverPolicy,
        frames: FrameLog,
        timeout_s: float | None,
        text_deltas: AsyncIterator[str] | None,
    ) -> None:
        self.source = source
        self.request = request
        self.policy = policy
        self.frames = frames
        self.metadata = ((REQUEST_ID_HEADER, request.request_id),)
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.text = _TextFeed(text_deltas)
        self.is_retry = frames.is_taken_over  # a talker stream of this segment was opened before
        self.num_sent = 0  # frames handed to the vocoder stream (its context included)
        self.num_delivered = 0  # frames whose audio was yielded

    def _time_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    # ---- talker side: frames into the log, on a replacement replica after a failure ----

    async def run_talker(self) -> None:
        failovers = Failovers("talker", self.request.request_id, self.source, self.policy)
        try:
            while not self.frames.is_finished:
                replica = await self.source.acquire("talker", self.policy.replica_wait_s)
                try:
                    await self._talker_stream(replica)
                except ReplicaFailed as error:
                    failovers.record(replica, error)
                finally:
                    self.source.release(replica)
        except BaseException as exc:
            self.frames.fail(exc)
            raise

    async def _talker_stream(self, replica) -> None:
        request = self.request
        if self.is_retry:
            # A fail-over: the new replica continues after the frames made so far. Its stream gets an id of its
            # own: the stream it replaces may still be open on that replica (its gateway process froze).
            request = talker_pb2.SynthesisRequest()
            request.CopyFrom(self.request)
            request.request_id = f"{self.request.request_id}~{secrets.token_hex(3)}"
            request.prefix_frames.CopyFrom(self.frames.chunk(0))
        self.is_retry = True
        if self.frames.talker_called_at is None:
            self.frames.talker_called_at = time.time()
        call = replica.stub.Synthesize(timeout=self._time_left(), metadata=self.metadata)
        writer = asyncio.create_task(self._write_text(call, request), name=f"text-{request.request_id}")
        try:
            while (output := await next_message(aiter(call), replica, self.policy)) is not None:
                if output.WhichOneof("output") == "chunk":
                    await self.frames.append(output.chunk)
                    continue
                check_final_for_failover(output.final, "talker")
                check_final(output.final, "talker")
                await writer  # surfaces a bad delta stream (the talker ended on our half-close)
                # A fail-over's stream timed itself from its own start: only a first stream's are the segment's.
                first_stream = request is self.request
                await self.frames.finish(output.final.usage.timings if first_stream else None)
                await await_status(call)
                return
            raise ReplicaFailed(f"talker {replica.target} ended the stream without a Final")
        except grpc.aio.AioRpcError as exc:
            _raise_for(exc, "talker")
        finally:
            call.cancel()
            # The writer ends with the stream: one left behind would still read the client's text deltas while a
            # fail-over's writer replays them, or after the segment ended.
            await cancel_and_drop(writer, "text writer")  # what ended the stream is raised

    async def _write_text(self, call, request: talker_pb2.SynthesisRequest) -> None:
        await call.write(talker_pb2.SynthesizeInput(request=request))
        if request.streaming_text:
            try:
                async for delta in self.text.deltas():
                    await call.write(talker_pb2.SynthesizeInput(text_delta=delta))
            except ChorusError:
                await call.done_writing()  # the talker ends with the text it has; `await writer` re-raises
                raise
            await call.write(talker_pb2.SynthesizeInput(end_of_input=True))
        await call.done_writing()

    # ---- vocoder side: PCM out, primed with the delivered frames after a failure ----

    async def pcm(self) -> AsyncIterator[common_pb2.PcmChunk]:
        failovers = Failovers("vocoder", self.request.request_id, self.source, self.policy)
        while True:
            replica = await self.source.acquire("vocoder", self.policy.replica_wait_s)
            try:
                async for pcm, num_frames in self._vocoder_stream(replica, self.num_delivered):
                    self.num_delivered += num_frames
                    yield pcm
                return
            except ReplicaFailed as error:
                failovers.record(replica, error)
            finally:
                self.source.release(replica)

    async def _vocoder_stream(self, replica, num_delivered: int) -> AsyncIterator[tuple[common_pb2.PcmChunk, int]]:
        call = replica.stub.Decode(timeout=self._time_left(), metadata=self.metadata)
        opening = vocoder_pb2.DecodeOpen(request_id=self.request.request_id, format=common_pb2.SAMPLE_FORMAT_PCM_F32LE)
        if num_delivered:
            opening.context_codes.CopyFrom(self.frames.chunk(0, num_delivered))
        sender = asyncio.create_task(self._send_frames(call, opening, num_delivered))
        try:
            while True:
                # The sender raises the talker side's failure while it waits for frames.
                output = await next_message(aiter(call), replica, self.policy, self._vocoder_owes, sender)
                if output is None:
                    raise ReplicaFailed(f"vocoder {replica.target} ended the stream without a Final")
                if output.WhichOneof("output") == "pcm":
                    num_samples = len(output.pcm.data) // (4 * max(1, output.pcm.num_channels))
                    yield output.pcm, round(num_samples * CODEC_FRAME_RATE_HZ / output.pcm.sample_rate_hz)
                    continue
                check_final_for_failover(output.final, "vocoder")
                check_final(output.final, "vocoder")
                await sender
                await await_status(call)
                return
        except grpc.aio.AioRpcError as exc:
            _raise_for(exc, "vocoder")
        finally:
            call.cancel()
            await cancel_and_drop(sender, "vocoder sender")  # what ended the stream is raised

    def _vocoder_owes(self) -> bool:
        """Whether the vocoder has work to answer (audio of frames sent, or its Final): silence is then a stall."""
        return self.num_sent > self.num_delivered or self.frames.is_finished

    async def _send_frames(self, call, opening: vocoder_pb2.DecodeOpen, num_context: int) -> None:
        """Frames after the `num_context` the stream was primed with, as they come (offsets count from there)."""
        await _write(call, vocoder_pb2.DecodeInput(open=opening))
        sequence = 0
        self.num_sent = num_context
        while True:
            num_frames = await self.frames.wait_beyond(self.num_sent)
            if num_frames > self.num_sent:
                chunk = self.frames.chunk(self.num_sent, num_frames, sequence, first=num_context)
                await _write(call, vocoder_pb2.DecodeInput(chunk=chunk))
                self.num_sent, sequence = num_frames, sequence + 1
            elif self.frames.is_finished:
                await _write(call, vocoder_pb2.DecodeInput(end_of_input=True))
                await call.done_writing()
                return


async def _write(call, message) -> None:
    """Writes to a vocoder stream; a stream the replica ended meanwhile is a replica failure."""
    try:
        await call.write(message)
    except (asyncio.InvalidStateError, grpc.aio.AioRpcError) as exc:
        raise ReplicaFailed(f"vocoder stream broke while sending ({type(exc).__name__})") from None


async def synthesize_segment(
    source: ReplicaSource,
    request: talker_pb2.SynthesisRequest,
    policy: FailoverPolicy = DEFAULT_POLICY,
    frames: FrameLog | None = None,
    timeout_s: float | None = None,
    text_deltas: AsyncIterator[str] | None = None,
) -> AsyncIterator[common_pb2.PcmChunk]:
    """PCM chunks for `request.text`, as soon as the vocoder makes them, whichever replicas fail meanwhile.

    With `text_deltas` (and `request.streaming_text`), more text follows the request while audio already
    streams back: each delta goes to the talker as it arrives, then `end_of_input`. `frames`: the segment's
    frames so far (a run taken over from another gateway process), else a new log.
    """
    pipeline = SegmentPipeline(source, request, policy, frames or FrameLog(), timeout_s, text_deltas)
    talker = None
    if not pipeline.frames.is_finished:
        talker = asyncio.create_task(pipeline.run_talker(), name=f"talker-{request.request_id}")
    try:
        async with contextlib.aclosing(pipeline.pcm()) as chunks:
            async for pcm in chunks:
                yield pcm
        if talker is not None:
            await talker
    finally:
        if talker is not None:
            with contextlib.suppress(ChorusError):
                await cancel_and_join(talker, "talker side")

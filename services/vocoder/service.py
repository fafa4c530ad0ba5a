"""The vocoder process: gRPC glue between `Vocoder.Decode`/`Encode` and the decode engine."""

from __future__ import annotations

import asyncio
import time

import grpc

from chorus.runtime.errors import InvalidRequest, Unavailable
from chorus.runtime.host import Service
from chorus.runtime.logs import request_id_var
from chorus.runtime.tasks import cancel_and_join, cancel_and_wait
from chorus.v1 import common_pb2, vocoder_pb2, vocoder_pb2_grpc
from chorus.vocoder import metrics
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.engine.build import build_engine
from chorus.vocoder.engine.engine import BatchReport, DecodeEngine, DecodeStream, EngineSettings, StreamEnded
from chorus.wire import chunk_to_codes, codes_to_chunk, pcm_to_chunk


def _record_batch(report: BatchReport) -> None:
    metrics.DECODE_SECONDS.observe(report.decode_s)
    metrics.BATCH_SIZE.observe(report.batch_size)
    metrics.IDLE_ROWS.inc(report.num_rows - report.batch_size)
    metrics.AUDIO_SECONDS.inc(report.audio_s)
    for wait_s in report.end_waits_s:
        metrics.END_WAIT_SECONDS.observe(wait_s)
    for tail_s in report.end_tails_s:
        metrics.END_TAIL_SECONDS.observe(tail_s)


async def _feed(request_iterator, stream: DecodeStream) -> None:
    """Client messages after `open` → the engine. A bad message ends the stream (the reader then raises).

    Input must end with `end_of_input`. A bare end of the request stream is what a cancelled call looks like
    here (gRPC ends the iterator before it cancels the handler), so it drops the stream: its pending frames are
    not decoded for nobody, and a client that half-closed without `end_of_input` gets INVALID_ARGUMENT."""
    try:
        num_frames_sent = 0
        async for message in request_iterator:
            kind = message.WhichOneof("input")
            if kind == "end_of_input":
                stream.end_input()
                return
            if kind != "chunk":
                raise InvalidRequest(f"Decode: unexpected `{kind}` message after `open`")
            if message.chunk.frame_offset != num_frames_sent:
                raise InvalidRequest(
                    f"chunk.frame_offset: expected {num_frames_sent} (frames sent so far), "
                    f"got {message.chunk.frame_offset}"
                )
            codes = chunk_to_codes(message.chunk)
            await stream.send(codes)
            num_frames_sent += len(codes)
        raise InvalidRequest("Decode: the input ended without `end_of_input`; the stream is dropped undecoded")
    except BaseException:
        stream.close()
        raise


class VocoderServicer(vocoder_pb2_grpc.VocoderServicer):
    def __init__(self, service: VocoderService) -> None:
        self.service = service

    async def Decode(self, request_iterator, context):
        engine = self.service.require_engine()
        admitted = time.perf_counter()
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("input") != "open":
            raise InvalidRequest("Decode: the first message must be `open`")
        opening = first.open
        if opening.request_id:
            request_id_var.set(opening.request_id)
        context_codes = None
        if opening.context_codes.num_frames:
            context_codes = chunk_to_codes(opening.context_codes, "open.context_codes")
        sample_format = opening.format or common_pb2.SAMPLE_FORMAT_PCM_S16LE
        sample_rate_hz = engine.runner.decoder.config.output_sample_rate_hz

        first_output_ms = 0.0
        async with engine.open_stream(request_id_var.get(), context_codes) as stream:
            feeder = asyncio.create_task(_feed(request_iterator, stream))
            try:
                sequence = 0
                async for piece in stream:
                    if sequence == 0:
                        first_output_ms = (time.perf_counter() - admitted) * 1e3
                    chunk = pcm_to_chunk(piece.waveform, sample_rate_hz, sample_format, sequence, piece.sample_offset)
                    yield vocoder_pb2.DecodeOutput(pcm=chunk)
                    sequence += 1
            except BaseException as exc:
                # The feeder ends with the call: one left behind would still read the client's messages after the
                # handler returned. What ended the stream is raised, unless a bad message of the feeder ended it.
                ended_by_feeder = isinstance(exc, StreamEnded) and feeder.done() and not feeder.cancelled()
                await cancel_and_wait([feeder], "decode feeder")
                # Read even when not raised (the call given up where it yielded, after its input ended): an error
                # never read is logged as "Task exception was never retrieved" when the task is collected.
                feeder_error = feeder.exception() if feeder.done() and not feeder.cancelled() else None
                if ended_by_feeder and feeder_error is not None:
                    raise feeder_error from None
                raise
            await cancel_and_join(feeder, "decode feeder")  # done after `end_of_input`: raises its error, if any
            num_frames = stream.num_frames_decoded
        total_ms = (time.perf_counter() - admitted) * 1e3
        usage = common_pb2.Usage(
            num_frames=num_frames,
            audio_s=num_frames * engine.samples_per_frame / sample_rate_hz,
            timings=common_pb2.Timings(first_output_ms=first_output_ms, total_ms=total_ms),
        )
        yield vocoder_pb2.DecodeOutput(final=common_pb2.Final(reason=common_pb2.FINISH_REASON_COMPLETE, usage=usage))

    async def Encode(self, request, context):
        if request.request_id:
            request_id_var.set(request.request_id)
        encoded = await self.service.require_engine().encode(request.audio)
        return vocoder_pb2.EncodeResponse(codes=codes_to_chunk(encoded.codes, 0, 0), audio_s=encoded.audio_s)

    async def GetLoad(self, request, context):
        stats = self.service.require_engine().stats()
        return common_pb2.LoadReport(
            live_streams=stats.live_streams, free_slots=stats.free_slots, queue_depth=stats.queued_streams
        )


class VocoderService(Service):
    name = "vocoder"
    grpc_services = ("chorus.v1.Vocoder",)

    def __init__(self, config: VocoderConfig, stream_priority: int | None = None) -> None:
        """`stream_priority`: decode on a CUDA stream of its own (when sharing a process, see `chorus.speech`)."""
        self.config = config
        self.stream_priority = stream_priority
        self.engine: DecodeEngine | None = None

    def require_engine(self) -> DecodeEngine:
        if self.engine is None:
            raise Unavailable("vocoder is warming up")
        return self.engine

    def register(self, server: grpc.aio.Server) -> None:
        vocoder_pb2_grpc.add_VocoderServicer_to_server(VocoderServicer(self), server)

    async def start(self) -> None:
        config = self.config
        settings = EngineSettings(
            max_batch_size=config.max_batch_size,
            batch_window_s=config.batch_window_ms / 1e3,
            sweep_interval_s=config.sweep_interval_ms / 1e3,
            max_plan_batches=config.max_plan_batches,
            idle_timeout_s=config.idle_timeout_s,
            max_reference_audio_s=config.max_reference_audio_s,
        )
        # Loading (and graph capture) runs off the loop so health keeps answering NOT_SERVING meanwhile.
        engine = await asyncio.to_thread(
            build_engine,
            config,
            settings,
            use_cuda_graphs=config.use_cuda_graphs,
            on_batch=_record_batch,
            stream_priority=self.stream_priority,
        )
        await engine.start()
        metrics.LIVE_STREAMS.set_function(lambda: engine.stats().live_streams)
        metrics.STATE_BYTES.set_function(lambda: engine.stats().state_bytes)
        self.engine = engine

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.stop()

"""The talker process: gRPC glue between `Talker.Synthesize` and the talker engine."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path

import grpc
import torch

from chorus.runtime.errors import InvalidRequest, Overloaded, Unavailable
from chorus.runtime.host import Service
from chorus.runtime.logs import request_id_var
from chorus.runtime.tasks import cancel_and_join
from chorus.talker import metrics
from chorus.talker.config import TalkerConfig
from chorus.talker.engine.engine import EngineConfig, EngineFullError, TalkerEngine
from chorus.talker.engine.request import FinishReason
from chorus.talker.engine.stream import FrameStream
from chorus.talker.loader import build_talker, resolve_device_dtype
from chorus.talker.prompt import VoiceRequest
from chorus.talker.sampling import SamplingParams
from chorus.talker.speaker_cache import SpeakerVectorCache
from chorus.v1 import common_pb2, talker_pb2, talker_pb2_grpc
from chorus.wire import chunk_to_codes, codes_to_chunk

_log = logging.getLogger(__name__)
SPEAKER_SAMPLE_RATE_HZ = 24_000
MAX_REFERENCE_AUDIO_S = 60.0
_MODES = {
    talker_pb2.TASK_TYPE_CUSTOM_VOICE: "custom_voice",
    talker_pb2.TASK_TYPE_VOICE_DESIGN: "voice_design",
    talker_pb2.TASK_TYPE_VOICE_CLONE: "voice_clone",
}
_TASK_TYPES = {mode: task_type for task_type, mode in _MODES.items()}
_FINISH_REASONS = {
    FinishReason.EOS: common_pb2.FINISH_REASON_EOS,
    FinishReason.MAX_LENGTH: common_pb2.FINISH_REASON_MAX_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def _sampling(defaults: SamplingParams, message: talker_pb2.SamplingParams, seed: int | None) -> SamplingParams:
    """The request's sampling: the checkpoint's defaults, overridden by every field the request sets."""
    overrides = {"seed": seed, "do_sample": not message.greedy}
    for field in ("temperature", "top_k", "top_p", "repetition_penalty", "subtalker_temperature",
                  "subtalker_top_k", "subtalker_top_p"):  # fmt: skip
        if message.HasField(field):
            overrides[field] = getattr(message, field)
    if message.HasField("subtalker_greedy"):
        overrides["subtalker_do_sample"] = not message.subtalker_greedy
    elif message.greedy:
        overrides["subtalker_do_sample"] = False
    fields = {name: getattr(defaults, name) for name in defaults.__dataclass_fields__}
    return SamplingParams(**{**fields, **overrides})


def _reference_audio(data: bytes, field: str = "reference_audio") -> torch.Tensor:
    from chorus.vocoder.audio_io import decode_audio

    waveform = decode_audio(
        data, sample_rate_hz=SPEAKER_SAMPLE_RATE_HZ, max_duration_s=MAX_REFERENCE_AUDIO_S, field=field
    )
    return torch.from_numpy(waveform)


def chunk_size(sequence: int, chunk_frames: int) -> int:
    """Frames in chunk `sequence`: 1, 2, 4, … up to `chunk_frames` (fewer only at the end).

    The first audio leaves after one frame (time to first audio), and each next chunk holds about as much audio as
    all before it: a player that starts on the first chunk has the whole sent audio to play while the next chunk
    is generated, so it does not run dry while chunks grow to the configured size (a 25-frame chunk right after
    the first frame would leave it 80 ms of audio to cover the generation of 25 frames)."""
    return min(chunk_frames, 1 << min(sequence, 30))


@dataclasses.dataclass(frozen=True, slots=True)
class _PendingSpeakerVector:
    """A request whose reference audio the engine embeds at prefill (`voice.speaker_vector`)."""

    audio_key: str
    voice: VoiceRequest

    def store(self, cache: SpeakerVectorCache) -> None:
        if self.voice.speaker_vector is not None:
            cache.put(self.audio_key, self.voice.speaker_vector)


class TalkerServicer(talker_pb2_grpc.TalkerServicer):
    def __init__(self, service: TalkerService) -> None:
        self.service = service

    def _submit(
        self, engine: TalkerEngine, request: talker_pb2.SynthesisRequest
    ) -> tuple[FrameStream, _PendingSpeakerVector | None]:
        """The request's stream, and on a speaker-cache miss what to cache once the engine embedded the audio."""
        modes, _, _ = engine.voices()
        mode = _MODES.get(request.task_type, modes[0])
        if mode not in modes:
            raise InvalidRequest(f"task_type: this checkpoint serves {', '.join(modes)}, not {mode}")
        clone = request.voice_clone
        speaker_vector = torch.tensor(clone.speaker_embedding) if clone.speaker_embedding else None
        audio_key = None
        if clone.reference_audio and speaker_vector is None:
            audio_key = SpeakerVectorCache.key(clone.reference_audio)
            speaker_vector = self.service.speaker_vectors.get(audio_key)
        ref_audio = _reference_audio(clone.reference_audio) if audio_key and speaker_vector is None else None
        ref_codes = prefix_frames = None
        if clone.reference_codes.num_frames and not clone.x_vector_only:
            ref_codes = torch.from_numpy(chunk_to_codes(clone.reference_codes, "voice_clone.reference_codes"))
        if request.prefix_frames.num_frames:
            prefix_frames = torch.from_numpy(chunk_to_codes(request.prefix_frames, "prefix_frames"))
        voice = engine.voice_request(
            mode,
            request.text,
            text_complete=not request.streaming_text,
            language=request.language or "auto",
            speaker=request.speaker or None,
            instructions=request.instructions,
            ref_text=clone.reference_text,
            ref_codes=ref_codes,
            speaker_vector=speaker_vector,
            ref_audio=ref_audio,
            prefix_frames=prefix_frames,
        )
        seed = request.seed if request.HasField("seed") else None
        sampling = _sampling(engine.loaded.sampling_defaults, request.sampling, seed)
        try:
            stream = engine.submit(
                request.request_id, voice, sampling, request.max_frames or None, ignore_eos=request.ignore_eos
            )
        except EngineFullError as exc:
            raise Overloaded(str(exc), retry_after_s=1.0) from None
        return stream, (_PendingSpeakerVector(audio_key, voice) if ref_audio is not None else None)

    async def Synthesize(self, request_iterator, context):
        received_at_s = time.time()  # the call taken in (its way here: `chorus bench tts` splits a request's TTFP)
        engine = self.service.require_engine()
        messages = aiter(request_iterator)
        first = await anext(messages, None)
        if first is None or first.WhichOneof("input") != "request":
            raise InvalidRequest("Synthesize: the first message must be `request`")
        request = first.request
        request.request_id = request.request_id or request_id_var.get()
        request_id_var.set(request.request_id)
        chunk_frames = request.chunk_frames or self.service.config.chunk_frames
        stream, pending_vector = self._submit(engine, request)
        feeder = asyncio.create_task(self._feed_text(engine, request, messages))
        try:
            # A resumed request's frame offsets go on from its prefix; sequence numbers count this stream's chunks.
            sequence, frame_offset = 0, stream.first_frame_index
            while (frames := await stream.read(*[chunk_size(sequence, chunk_frames)] * 2)) is not None:
                if pending_vector is not None:  # a frame exists: the engine has embedded the reference
                    pending_vector.store(self.service.speaker_vectors)
                    pending_vector = None
                if sequence == 0:
                    metrics.QUEUE_SECONDS.observe(stream.scheduled_at - stream.admitted_at)
                    metrics.FIRST_FRAME_SECONDS.observe(stream.first_frame_at - stream.admitted_at)
                    if stream.steps_to_first_frame is not None:
                        metrics.STEPS_TO_FIRST_FRAME.observe(stream.steps_to_first_frame)
                yield talker_pb2.SynthesizeOutput(chunk=codes_to_chunk(frames, sequence, frame_offset))
                sequence += 1
                frame_offset += len(frames)
            if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
                raise feeder.exception()
        finally:
            if not stream.finished:
                engine.abort(request.request_id)  # client gone, deadline passed or bad input: free the slot
            await cancel_and_join(feeder, "text feeder")
        yield talker_pb2.SynthesizeOutput(final=self._final(stream, received_at_s))

    async def _feed_text(self, engine: TalkerEngine, request: talker_pb2.SynthesisRequest, messages) -> None:
        """Streaming text input: deltas go to the engine until end_of_input (or the client half-closes)."""
        if not request.streaming_text:
            return
        try:
            async for message in messages:
                kind = message.WhichOneof("input")
                if kind == "end_of_input":
                    break
                if kind != "text_delta":
                    raise InvalidRequest(f"Synthesize: unexpected `{kind}` message after `request`")
                engine.add_text(request.request_id, message.text_delta)
        except BaseException:
            engine.abort(request.request_id)
            raise
        engine.end_text(request.request_id)

    @staticmethod
    def _final(stream: FrameStream, received_at_s: float) -> common_pb2.Final:
        def ms(at: float | None) -> float:
            return (at - stream.admitted_at) * 1e3 if at is not None else 0.0

        timings = common_pb2.Timings(
            queue_ms=ms(stream.scheduled_at),
            first_output_ms=ms(stream.first_frame_at),
            total_ms=ms(stream.finished_at),
            admitted_at_s=stream.admitted_at_unix_s,
            received_at_s=received_at_s,
        )
        usage = common_pb2.Usage(
            input_tokens=stream.num_text_tokens,
            num_frames=stream.num_frames,
            audio_s=stream.num_frames / 12.5,
            timings=timings,
        )
        final = common_pb2.Final(reason=_FINISH_REASONS[stream.finish_reason], usage=usage)
        if stream.finish_reason is FinishReason.ERROR:
            final.error.CopyFrom(common_pb2.Error(code="INTERNAL", message=stream.error or "talker error"))
        return final

    async def GetLoad(self, request, context):
        load = self.service.require_engine().load()
        return common_pb2.LoadReport(
            live_streams=load.live_streams, free_slots=load.free_slots, queue_depth=load.queue_depth
        )

    async def ListVoices(self, request, context):
        modes, speakers, languages = self.service.require_engine().voices()
        return talker_pb2.ListVoicesResponse(
            model=self.service.config.model,
            task_types=[_TASK_TYPES[mode] for mode in modes],
            speakers=speakers,
            languages=languages,
        )

    async def EmbedSpeaker(self, request, context):
        engine = self.service.require_engine()
        key = SpeakerVectorCache.key(request.audio)
        vector = self.service.speaker_vectors.get(key)
        if vector is None:
            audio = await asyncio.to_thread(_reference_audio, request.audio, "audio")
            vector = await asyncio.wrap_future(engine.embed_speaker(audio))
            self.service.speaker_vectors.put(key, vector)
        return talker_pb2.EmbedSpeakerResponse(speaker_embedding=vector.float().tolist())


class TalkerService(Service):
    name = "talker"
    grpc_services = ("chorus.v1.Talker",)

    def __init__(self, config: TalkerConfig, stream_priority: int | None = None) -> None:
        """`stream_priority`: run the engine on a CUDA stream of its own (when sharing a process, see
        `chorus.speech`)."""
        self.config = config
        self.stream_priority = stream_priority
        self.engine: TalkerEngine | None = None
        self.speaker_vectors = SpeakerVectorCache()
        self._collector = None

    def require_engine(self) -> TalkerEngine:
        if self.engine is None:
            raise Unavailable("talker is warming up")
        return self.engine

    def register(self, server: grpc.aio.Server) -> None:
        talker_pb2_grpc.add_TalkerServicer_to_server(TalkerServicer(self), server)

    def _build_engine(self) -> TalkerEngine:
        config = self.config
        device, dtype = resolve_device_dtype(config.device, config.dtype)
        loaded = build_talker(config.model, config.load_format, device, dtype, Path(config.cache_dir).expanduser())
        engine_config = EngineConfig(
            max_streams=config.max_streams,
            max_positions=config.max_positions,
            kv_cache_positions=config.kv_cache_positions,
            kv_memory_fraction=config.kv_memory_fraction,
            max_frames=config.max_frames,
            max_queue=config.max_queue,
            max_buffered_frames=config.max_buffered_frames,
            max_prefills_per_step=config.max_prefills_per_step,
            use_cuda_graphs=config.use_cuda_graphs,
            compile_step=config.compile_step,
            few_rows_matmul=config.few_rows_matmul,
            stream_priority=self.stream_priority,
        )
        engine = TalkerEngine(loaded, engine_config)
        started = time.perf_counter()
        engine.runner.warmup(config.warmup_positions)  # compile and capture now, not on the first requests
        graphs = engine.runner.graphs
        _log.info(
            "talker warm-up: %d decode graphs in %.1f s",
            len(graphs.graphs) if graphs is not None else 0,
            time.perf_counter() - started,
        )
        return engine

    async def start(self) -> None:
        # Loading and graph capture block: off the loop, so health keeps answering NOT_SERVING meanwhile.
        self.engine = await asyncio.to_thread(self._build_engine)
        self.engine.start()
        self._collector = metrics.register(self.engine)

    async def close(self) -> None:
        try:
            if self.engine is not None:
                await asyncio.to_thread(self.engine.stop)
        finally:  # a collector left registered fails every later talker of the process ("Duplicated timeseries")
            if self._collector is not None:
                metrics.unregister(self._collector)
                self._collector = None

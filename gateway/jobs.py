"""Starting requests and following them: shared by the REST and gRPC APIs.

A request is admitted first (429 beyond the backend's queue), then its idempotency key is
claimed (a retry with the same key gets the earlier request, not a second generation, unless that request failed
on the server's side, was cancelled because its client went away, or expired: then the retry runs anew), then its
record is created and its run started on this replica (handed unstarted to another one if this process began
draining meanwhile). Anyone may follow it from any replica: progress through the record, audio through the
output journal (in memory on the run's replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import PurePath

from chorus.gateway.audio import FORMATS
from chorus.gateway.context import GatewayContext
from chorus.gateway.frame_log import FRAME_BYTES
from chorus.gateway.generation_run import GenerationRun
from chorus.gateway.journaled_run import JournaledRun
from chorus.gateway.run_spec import GenerationSpec, RunSpec, SpeechSpec, decode_spec, encode_spec
from chorus.gateway.schemas import GenerationRequest, SpeechRequest
from chorus.gateway.speech_pipeline import synthesize_segment
from chorus.gateway.speech_run import SpeechRun, segment_requests
from chorus.gateway.state import keys
from chorus.gateway.state.frames import SegmentFrames
from chorus.gateway.state.journal import JournalPosition
from chorus.gateway.state.requests import TERMINAL, RequestRecord
from chorus.gateway.state.runs import RunEntry
from chorus.gateway.state.voices import Voice
from chorus.gateway.talker_request import synthesis_request
from chorus.gateway.voices import speech_in, voice_clone
from chorus.runtime.errors import NotFound, Unavailable
from chorus.v1 import common_pb2, diffusion_pb2, talker_pb2

PROGRESS_POLL_INTERVAL_S = 0.1
DIFFUSION_MODEL = "stable-audio-open-1.0"  # what /v1/models lists for the diffusion service
DRAINING = "this gateway process is shutting down; retry (another process takes new requests)"


async def _admit(
    ctx: GatewayContext, kinds: tuple[str, ...], owner: str, idempotency_key: str | None
) -> RequestRecord | contextlib.AsyncExitStack:
    """The backends' slots for a new request (an entered stack to close when it ends); with a known
    `idempotency_key`, the earlier request instead (nothing new runs, and a retry is answered even while
    admission is full)."""
    if idempotency_key and (earlier_id := await ctx.requests.idempotent_request(owner, idempotency_key)):
        return await ctx.requests.get(earlier_id)
    if ctx.broker.is_draining:
        raise Unavailable(DRAINING)
    ctx.require_backends(*kinds)
    slot = contextlib.AsyncExitStack()
    await slot.enter_async_context(ctx.admission.enter(*kinds))
    return slot


async def _start(
    ctx: GatewayContext,
    slot: contextlib.AsyncExitStack,
    owner: str,
    idempotency_key: str | None,
    request_id: str,
    spec: RunSpec,
    is_detachable: bool,
    arrived_s: float,
    text_deltas: AsyncIterator[str] | None = None,
    **record_fields: str,
) -> RequestRecord:
    """Creates the request's record and its run in one step and starts the run here; with an
    `idempotency_key` a concurrent twin claimed meanwhile, the twin's request instead. `arrived_s` (time.time()):
    when the request reached this process, before its admission (the run's `arrived` mark)."""
    try:
        if text_deltas is not None and ctx.broker.is_draining:  # its text streams in here: no other process can run it
            raise Unavailable(DRAINING)
        record, fields = ctx.requests.new_record(
            owner=owner, request_id=request_id, runner=ctx.broker.runner, **record_fields
        )
        # Claimed only once admitted, so a refused request leaves no key behind; kept as long as the record (a key
        # whose request expired would be released by the next retry anyway).
        ttl_s = ctx.requests.ttl_s
        idempotency = (keys.idempotency(owner, idempotency_key), ttl_s) if idempotency_key else None
        is_new, value = await ctx.broker.queue.admit(fields, encode_spec(spec), ctx.requests.ttl_s, idempotency)
    except BaseException:
        await slot.aclose()
        raise
    if not is_new:
        await slot.aclose()
        return await ctx.requests.get(value)
    run = build_run(ctx, request_id, spec, text_deltas=text_deltas)
    run.mark("arrived", arrived_s)
    # Handed to the other processes unstarted if the drain began while it waited for its slot.
    await ctx.broker.start_run(run, value, slot, is_detachable)
    return record


async def start_generation(
    ctx: GatewayContext, body: GenerationRequest, owner: str, idempotency_key: str | None, is_detachable: bool
) -> RequestRecord:
    """Admits and starts a text-to-audio request; with a known `idempotency_key`, the earlier request."""
    arrived_s = time.time()
    ctx.require_backends("diffusion")
    if body.model != DIFFUSION_MODEL:
        raise NotFound(f"model {body.model!r} not found; text-to-audio serves {DIFFUSION_MODEL!r}")
    admitted = await _admit(ctx, ("diffusion",), owner, idempotency_key)
    if isinstance(admitted, RequestRecord):
        return admitted
    request_id = ctx.requests.new_id()
    # A 16-bit file takes int16 samples, which the service converts on its GPU: half the bytes on the wire, and the
    # encoder writes them as they come. Every other format encodes from the float samples.
    is_s16 = FORMATS[body.response_format].is_s16_pcm
    request = diffusion_pb2.GenerateRequest(
        request_id=request_id,
        prompt=body.prompt,
        negative_prompt=body.negative_prompt or "",
        duration_s=body.duration_s,
        num_steps=body.num_steps or 0,
        guidance_scale=body.guidance_scale,
        seed=_seed(body.seed),
        sample_format=common_pb2.SAMPLE_FORMAT_PCM_S16LE if is_s16 else common_pb2.SAMPLE_FORMAT_PCM_F32LE,
    )
    spec = GenerationSpec(request, body.response_format)
    fields = {"kind": "audio", "model": body.model, "response_format": body.response_format}
    return await _start(ctx, admitted, owner, idempotency_key, request_id, spec, is_detachable, arrived_s, **fields)


def _seed(requested: int | None) -> int:
    """The request's seed, drawn here when it has none: a run started again elsewhere makes the same output."""
    return requested if requested is not None else secrets.randbits(63)


def build_run(
    ctx: GatewayContext,
    request_id: str,
    spec: RunSpec,
    text_deltas: AsyncIterator[str] | None = None,
    resume: JournalPosition | None = None,
    frames: list[SegmentFrames] | None = None,
) -> JournaledRun:
    """The run of `spec` in this process: a new one, or (`resume`) one taken over at that journal position."""
    runner = ctx.broker.runner
    if isinstance(spec, GenerationSpec):
        return GenerationRun(
            ctx.requests,
            ctx.journal,
            ctx.cancels,
            spec.request,
            ctx.backends,
            spec.response_format,
            ctx.config.failover,
            runner,
            resume,
            ctx.encoder_threads,
        )
    return SpeechRun(
        ctx.requests,
        ctx.journal,
        ctx.cancels,
        request_id,
        spec.segments,
        lambda request, log: synthesize_segment(ctx.backends, request, ctx.config.failover, log, None, text_deltas),
        spec.response_format,
        speed=spec.speed,
        max_concurrent_segments=ctx.config.speech_concurrent_segments,
        max_lead_s=ctx.config.max_output_lead_s if resume is None else None,
        frame_journal=ctx.frame_journal,
        runner=runner,
        resume=resume,
        frames=frames,
        encoder_threads=ctx.encoder_threads,
    )


async def continue_run(ctx: GatewayContext, entry: RunEntry) -> JournaledRun | None:
    """A run another process stopped renewing, taken over where its journal ends; None if it had ended."""
    status = await ctx.requests.take(entry.request_id, ctx.broker.runner)
    if status is None or status in TERMINAL:
        return None
    spec = decode_spec(entry.spec)
    resume = await ctx.journal.position(entry.request_id)
    if isinstance(spec, SpeechSpec) and spec.streams_text:
        return _Unrecoverable(
            ctx, entry.request_id, resume, "its text streamed in over a connection to a gateway process that stopped"
        )
    frames = None
    if isinstance(spec, SpeechSpec):
        frames = await ctx.frame_journal.read(entry.request_id, len(spec.segments), FRAME_BYTES)
    return build_run(ctx, entry.request_id, spec, resume=resume, frames=frames)


class _Unrecoverable(JournaledRun):
    """A run that cannot be continued elsewhere: it fails, saying why."""

    def __init__(self, ctx: GatewayContext, request_id: str, resume: JournalPosition, reason: str) -> None:
        super().__init__(ctx.requests, ctx.journal, ctx.cancels, request_id, ctx.broker.runner, resume)
        self.reason = reason

    async def _produce(self) -> dict:
        raise Unavailable(f"request {self.request_id} cannot be continued: {self.reason}")


async def check_speech_target(ctx: GatewayContext, owner: str, body: SpeechRequest) -> Voice | None:
    """NotFound unless the loaded talker is `body.model` (its id as /v1/models lists it, or that id's last
    path component) and has `body.voice`; the saved voice it names, None for a built-in speaker or none."""
    talker = await ctx.catalog.voices()
    if body.model not in (talker.model, PurePath(talker.model).name):
        raise NotFound(f"model {body.model!r} not found; GET /v1/models lists the available ones")
    return await ctx.voices.for_speech(owner, body, talker)


async def start_speech(
    ctx: GatewayContext,
    body: SpeechRequest,
    owner: str,
    idempotency_key: str | None,
    ref_audio: bytes | None,
    text_deltas: AsyncIterator[str] | None = None,
) -> RequestRecord:
    """Admits and starts a speech request (detachable: it stops once no reader is left).

    With `text_deltas`, `body.input` is only the start of the text: the rest streams in (one
    segment, the talker's streaming-text layout) until the iterator ends.
    """
    arrived_s = time.time()
    saved_voice = await check_speech_target(ctx, owner, body)
    fields = {"kind": "speech", "model": body.model, "voice": body.voice or "", "response_format": body.response_format}
    admitted = await _admit(ctx, ("talker", "vocoder"), owner, idempotency_key)
    if isinstance(admitted, RequestRecord):
        return admitted
    request_id = ctx.requests.new_id()
    try:
        clone = None
        if saved_voice is not None:
            clone = voice_clone(saved_voice)
            body = speech_in(saved_voice, body)
        elif ref_audio is not None or body.speaker_embedding is not None:
            clone = await ctx.reference_codes.voice_clone(
                ref_audio, body.ref_text, body.x_vector_only, request_id, body.speaker_embedding
            )
    except BaseException:
        await admitted.aclose()
        raise
    base = synthesis_request(body, clone)
    base.seed = _seed(body.seed)
    if text_deltas is None:
        segments = segment_requests(request_id, base, body.input, ctx.config.speech_segment_chars)
    else:
        base.streaming_text = True
        segments = [talker_pb2.SynthesisRequest(request_id=f"{request_id}.0", text=body.input)]
        segments[0].MergeFrom(base)
    spec = SpeechSpec(segments, body.response_format, body.speed, streams_text=text_deltas is not None)
    return await _start(ctx, admitted, owner, idempotency_key, request_id, spec, True, arrived_s, text_deltas, **fields)


async def follow_record(ctx: GatewayContext, request_id: str) -> AsyncIterator[RequestRecord]:
    """The request's record each time its status or progress changes, ending with a terminal one."""
    seen: tuple | None = None
    while True:
        record = await ctx.requests.get(request_id)
        if (record.status, record.progress) != seen:
            seen = (record.status, record.progress)
            yield record
        if record.status in TERMINAL:
            return
        await asyncio.sleep(PROGRESS_POLL_INTERVAL_S)

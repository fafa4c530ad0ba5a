"""Starting requests and following them: shared by the REST and gRPC APIs.

A request is admitted first (429 beyond the backend's queue), then its idempotency key is
claimed (a retry with the same key gets the earlier request, not a second generation), then its
record is created and its run started on this replica. Anyone may follow it from any replica:
progress through the record, audio through the output journal (in memory on the run's replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import PurePath

from chorus.gateway.context import GatewayContext
from chorus.gateway.frame_log import FRAME_BYTES
from chorus.gateway.generation_run import GenerationRun
from chorus.gateway.journaled_run import JournaledRun, JournalPosition
from chorus.gateway.run_spec import GenerationSpec, RunSpec, SpeechSpec, decode_spec, encode_spec
from chorus.gateway.schemas import GenerationRequest, SpeechRequest
from chorus.gateway.speech_pipeline import synthesize_segment
from chorus.gateway.speech_run import SpeechRun, segment_requests
from chorus.gateway.state.frames import SegmentFrames
from chorus.gateway.state.requests import FAILED, TERMINAL, RequestRecord
from chorus.gateway.state.runs import RunEntry
from chorus.gateway.state.voices import Voice
from chorus.gateway.talker_request import synthesis_request
from chorus.gateway.voices import speech_in, voice_clone
from chorus.runtime.errors import NotFound, Unavailable, status_for
from chorus.v1 import diffusion_pb2, talker_pb2

PROGRESS_POLL_INTERVAL_S = 0.1
DIFFUSION_MODEL = "stable-audio-open-1.0"  # what /v1/models lists for the diffusion service


async def _admit(
    ctx: GatewayContext, kinds: tuple[str, ...], owner: str, idempotency_key: str | None, **record_fields: str
) -> tuple[RequestRecord, contextlib.AsyncExitStack | None]:
    """Takes the backends' slots and creates the record; with a known `idempotency_key`, the earlier
    request and no slot (nothing new runs, and a retry is answered even while admission is full)."""
    if idempotency_key and (earlier_id := await ctx.requests.idempotent_request(owner, idempotency_key)):
        return await ctx.requests.get(earlier_id), None
    if ctx.broker.is_draining:
        raise Unavailable("this gateway process is shutting down; retry (another process takes new requests)")
    ctx.require_backends(*kinds)
    slot = contextlib.AsyncExitStack()
    await slot.enter_async_context(ctx.admission.enter(*kinds))
    try:
        request_id = ctx.requests.new_id()
        if idempotency_key:
            # Claimed only once admitted, so a refused request leaves no key behind; this catches a
            # concurrent twin that claimed the key since the look above.
            earlier_id = await ctx.requests.claim_idempotency_key(owner, idempotency_key, request_id)
            if earlier_id is not None:
                await slot.aclose()
                return await ctx.requests.get(earlier_id), None
        record = await ctx.requests.create(
            owner=owner, request_id=request_id, runner=ctx.broker.runner, **record_fields
        )
        return record, slot
    except BaseException:
        await slot.aclose()
        raise


async def start_generation(
    ctx: GatewayContext, body: GenerationRequest, owner: str, idempotency_key: str | None, is_detachable: bool
) -> RequestRecord:
    """Admits and starts a text-to-audio request; with a known `idempotency_key`, the earlier request."""
    ctx.require_backends("diffusion")
    if body.model != DIFFUSION_MODEL:
        raise NotFound(f"model {body.model!r} not found; text-to-audio serves {DIFFUSION_MODEL!r}")
    fields = {"kind": "audio", "model": body.model, "response_format": body.response_format}
    record, slot = await _admit(ctx, ("diffusion",), owner, idempotency_key, **fields)
    if slot is None:
        return record
    request = diffusion_pb2.GenerateRequest(
        request_id=record.request_id,
        prompt=body.prompt,
        negative_prompt=body.negative_prompt or "",
        duration_s=body.duration_s,
        num_steps=body.num_steps or 0,
        guidance_scale=body.guidance_scale,
        seed=_seed(body.seed),
    )
    await _start_run(ctx, record, GenerationSpec(request, body.response_format), slot, is_detachable)
    return record


def _seed(requested: int | None) -> int:
    """The request's seed, drawn here when it has none: a run started again elsewhere makes the same output."""
    return requested if requested is not None else secrets.randbits(63)


async def _start_run(
    ctx: GatewayContext,
    record: RequestRecord,
    spec: RunSpec,
    slot: contextlib.AsyncExitStack,
    is_detachable: bool,
    text_deltas: AsyncIterator[str] | None = None,
) -> None:
    run = build_run(ctx, record.request_id, spec, text_deltas=text_deltas)
    try:
        await ctx.broker.start_run(run, encode_spec(spec), slot, is_detachable)
    except BaseException:
        await slot.aclose()
        raise


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
            ctx.diffusion_window,
            spec.response_format,
            ctx.config.failover,
            runner,
            resume,
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
    )


async def continue_run(ctx: GatewayContext, entry: RunEntry) -> JournaledRun | None:
    """A run another process stopped renewing, taken over where its journal ends; None if it had ended."""
    status = await ctx.requests.take(entry.request_id, ctx.broker.runner)
    if status is None or status in TERMINAL:
        return None
    spec = decode_spec(entry.spec)
    num_chunks, num_bytes = await ctx.journal.position(entry.request_id)
    resume = JournalPosition(num_chunks, num_bytes)
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
    saved_voice = await check_speech_target(ctx, owner, body)
    fields = {"kind": "speech", "model": body.model, "voice": body.voice or "", "response_format": body.response_format}
    record, slot = await _admit(ctx, ("talker", "vocoder"), owner, idempotency_key, **fields)
    if slot is None:
        return record
    try:
        clone = None
        if saved_voice is not None:
            clone = voice_clone(saved_voice)
            body = speech_in(saved_voice, body)
        elif ref_audio is not None or body.speaker_embedding is not None:
            clone = await ctx.reference_codes.voice_clone(
                ref_audio, body.ref_text, body.x_vector_only, record.request_id, body.speaker_embedding
            )
    except BaseException as exc:
        await slot.aclose()
        code, message = status_for(exc)
        await ctx.requests.transition(record.request_id, FAILED, error={"code": code.name, "message": message})
        raise
    base = synthesis_request(body, clone)
    base.seed = _seed(body.seed)
    if text_deltas is None:
        segments = segment_requests(record.request_id, base, body.input, ctx.config.speech_segment_chars)
    else:
        base.streaming_text = True
        segments = [talker_pb2.SynthesisRequest(request_id=f"{record.request_id}.0", text=body.input)]
        segments[0].MergeFrom(base)
    spec = SpeechSpec(segments, body.response_format, body.speed, streams_text=text_deltas is not None)
    await _start_run(ctx, record, spec, slot, is_detachable=True, text_deltas=text_deltas)
    return record


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

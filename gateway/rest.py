"""The REST API (FastAPI). Handlers stay thin: auth, validation, then the gateway's orchestration.

Every error answers with the OpenAI envelope (`chorus.gateway.errors`). Endpoints that need a
backend answer 503 while it has no healthy replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from chorus.gateway.audio import FORMATS
from chorus.gateway.body_limit import BodyLimit
from chorus.gateway.context import GatewayContext
from chorus.gateway.errors import (
    OPENAPI_RESPONSES,
    UnsupportedMediaType,
    error_for_outcome,
    install_error_handlers,
)
from chorus.gateway.jobs import DIFFUSION_MODEL, follow_record, start_generation, start_speech
from chorus.gateway.metrics import CountOutcomes
from chorus.gateway.multipart_forms import MultipartForms, multipart_openapi
from chorus.gateway.ref_audio import resolve_ref_audio
from chorus.gateway.rest_voices import add_voice_routes
from chorus.gateway.schemas import GenerationRequest, RequestView, SpeechRequest
from chorus.gateway.state.connection import REDIS_ERRORS
from chorus.gateway.state.journal import JournalEntry
from chorus.gateway.state.requests import DONE, TERMINAL, RequestRecord
from chorus.gateway.streaming import as_bytes, as_sse, skip_bytes, sse_event
from chorus.runtime.metrics import metrics_registry
from chorus.runtime.tasks import cancel_and_wait

# The web page (plain HTML, JS modules and CSS; no build step) ships inside the package.
WEB_DIR = Path(__file__).parent / "web"

_DISCONNECT_POLL_S = 0.25  # how often a waiting synchronous request checks that its client is still there


def _view(record: RequestRecord) -> RequestView:
    return RequestView(
        id=record.request_id,
        kind=record.kind,
        status=record.status,
        model=record.model,
        voice=record.voice,
        created_at=record.created_at_s,
        started_at=record.started_at_s,
        finished_at=record.finished_at_s,
        usage=record.usage,
        error=record.error,
        last_sequence=record.last_sequence,
        progress=record.progress,
        timeline=record.timeline_ms(),
    )


async def _started(entries: AsyncIterator[JournalEntry], fail_early: bool = False) -> AsyncIterator[JournalEntry]:
    """Reads the first entry now, so a refused resume (trimmed journal) is an error status, not a
    broken stream; then yields it and the rest. `fail_early`: a request that ended without success
    before anything is left to send answers its error status too (raw audio cannot carry it)."""
    first = await anext(entries, None)
    if fail_early and first is not None and first.final is not None and first.final["status"] != DONE:
        await entries.aclose()
        raise error_for_outcome(first.final["status"], first.final.get("error"))
    return _chain(first, entries)


async def _chain(first: JournalEntry | None, rest: AsyncIterator[JournalEntry]) -> AsyncIterator[JournalEntry]:
    if first is None:
        return
    yield first
    async for entry in rest:
        yield entry


def create_app(ctx: GatewayContext) -> FastAPI:
    config = ctx.config
    app = FastAPI(title="Chorus", version="0.1.0", summary="Text-to-speech and text-to-audio serving.")
    install_error_handlers(app)
    app.add_middleware(MultipartForms, max_file_bytes=config.max_ref_audio_bytes, max_field_bytes=config.max_body_bytes)
    app.add_middleware(BodyLimit, max_body_bytes=config.max_body_bytes)
    app.add_middleware(CountOutcomes)

    async def authorize(request: Request) -> str:
        """The caller's key id ("" without auth), after its rate limit; 401 / 429 otherwise."""
        return await ctx.authorize(request.headers.get("authorization"))

    def require_json(request: Request) -> None:
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            raise UnsupportedMediaType(f"content-type must be application/json, got {content_type or 'none'!r}")

    app.mount("/web", StaticFiles(directory=WEB_DIR), name="web")

    @app.get("/", include_in_schema=False)
    async def web_page() -> FileResponse:
        """The web page: try speech, voice clone and text to audio from a browser."""
        return FileResponse(WEB_DIR / "index.html")

    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"])
    async def ready() -> JSONResponse:
        """Readiness: not shutting down, Redis answers and every backend has a healthy replica."""
        try:
            is_redis_up = bool(await asyncio.wait_for(ctx.redis.ping(), timeout=1.0))
        except (*REDIS_ERRORS, TimeoutError):
            is_redis_up = False
        is_draining = ctx.broker.is_draining
        is_ready = is_redis_up and ctx.backends.is_ready() and not is_draining
        body = {"ready": is_ready, "redis": is_redis_up, "backends": ctx.backends.status(), "draining": is_draining}
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics of this gateway replica (all its workers)."""
        return Response(generate_latest(metrics_registry()), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/audio/speech",
        tags=["speech"],
        responses=OPENAPI_RESPONSES,
        dependencies=[Depends(require_json)],
        response_class=Response,
        openapi_extra=multipart_openapi(SpeechRequest, "ref_audio", "Voice-clone reference audio file."),
    )
    async def create_speech(
        body: SpeechRequest,
        owner: str = Depends(authorize),
        idempotency_key: str | None = Header(None, max_length=256, description="Same key → same request."),
    ) -> StreamingResponse:
        """Text → speech, OpenAI-compatible: audio bytes as they are made (`stream_format: audio`) or
        `speech.audio.delta` / `speech.audio.done` events (`sse`). Resume with `/v1/requests/{id}/audio`.
        The body is JSON, or multipart/form-data with `ref_audio` as a file."""
        body.check_limits(config.max_input_chars)
        ref_audio = None
        if body.ref_audio is not None:
            ref_audio = await resolve_ref_audio(
                body.ref_audio, config.ref_audio_allowed_hosts, config.max_ref_audio_bytes
            )
        record = await start_speech(ctx, body, owner, idempotency_key, ref_audio)
        headers = {"X-Request-Id": record.request_id}
        chunks = ctx.runs.follow(record.request_id)
        first = await anext(chunks, None)
        if first is not None and first.final is not None and first.final["status"] != DONE:
            await chunks.aclose()  # failed before any audio: a proper error status, not a cut stream
            raise error_for_outcome(first.final["status"], first.final.get("error"))
        chunks = _chain(first, chunks)
        if body.stream_format == "sse":
            return StreamingResponse(as_sse(chunks), media_type="text/event-stream", headers=headers)
        media_type = FORMATS[record.response_format].content_type
        return StreamingResponse(as_bytes(chunks), media_type=media_type, headers=headers)

    @app.post(
        "/v1/audio/generations",
        tags=["text-to-audio"],
        responses=OPENAPI_RESPONSES,
        dependencies=[Depends(require_json)],
        response_class=Response,
    )
    async def create_generation(
        body: GenerationRequest,
        request: Request,
        owner: str = Depends(authorize),
        idempotency_key: str | None = Header(None, max_length=256, description="Same key → same request."),
    ) -> Response:
        """Prompt → audio (Stable Audio Open), synchronously (the audio file) or as a job (`mode: async`:
        202 with the request; follow `/v1/requests/{id}`, `/events`, `/audio`)."""
        body.check_limits(config.max_input_chars)
        is_async = body.mode == "async"
        record = await start_generation(ctx, body, owner, idempotency_key, is_detachable=not is_async)
        if is_async:
            location = {"Location": f"/v1/requests/{record.request_id}"}
            return JSONResponse(_view(record).model_dump(), status_code=202, headers=location)
        entries = await _output_unless_disconnected(request, record.request_id)
        if entries is None:
            return Response(status_code=499)  # nobody is listening; the run was detached and cancelled
        final = entries[-1].final
        if final["status"] != DONE:
            raise error_for_outcome(final["status"], final.get("error"))
        audio = b"".join(entry.data for entry in entries[:-1])
        media_type = FORMATS[record.response_format].content_type
        return Response(audio, media_type=media_type, headers={"X-Request-Id": record.request_id})

    async def _output_unless_disconnected(request: Request, request_id: str) -> list[JournalEntry] | None:
        """The request's whole output (end marker last), or None once the client has gone away. A run on this
        replica hands its entries over in memory (`RunRegistry.follow`): a 10 s wav is 1.8 MB not read back
        from Redis."""

        async def collect() -> list[JournalEntry]:
            return [entry async for entry in ctx.runs.follow(request_id)]

        collecting = asyncio.create_task(collect())  # a reader of the run while it follows (`follow` marks it)
        try:
            while True:
                done, _ = await asyncio.wait({collecting}, timeout=_DISCONNECT_POLL_S)
                if done:
                    return collecting.result()
                if await request.is_disconnected():
                    return None
        finally:
            # The follower ends with the request: one left behind still counts as a reader of the run (keeping a
            # run whose client is gone from being detached) until it notices its cancel.
            # Its own error is dropped: the client is gone, or what ended the wait is raised already.
            await cancel_and_wait([collecting], f"request {request_id} follower")

    @app.get("/v1/models", tags=["catalog"], responses=OPENAPI_RESPONSES)
    async def list_models(owner: str = Depends(authorize)) -> JSONResponse:
        """The models served (talker checkpoint, Stable Audio Open), OpenAI list format."""
        ctx.require_backends("talker")
        voices = await ctx.catalog.voices()
        models = [{"id": voices.model, "object": "model", "owned_by": "chorus", "task": "text-to-speech"}]
        if any(replica.is_healthy for replica in ctx.backends.replicas["diffusion"]):
            models.append({"id": DIFFUSION_MODEL, "object": "model", "owned_by": "chorus", "task": "text-to-audio"})
        return JSONResponse({"object": "list", "data": models})

    @app.get("/v1/requests/{request_id}", tags=["requests"], responses=OPENAPI_RESPONSES)
    async def get_request(request_id: str, owner: str = Depends(authorize)) -> RequestView:
        """Status, timings and usage of a request (any gateway replica can answer)."""
        return _view(await ctx.owned_record(request_id, owner))

    @app.get("/v1/requests/{request_id}/events", tags=["requests"], responses=OPENAPI_RESPONSES)
    async def request_events(request_id: str, owner: str = Depends(authorize)) -> StreamingResponse:
        """Server-sent events: `progress` ({step, num_steps}) as the run advances, then one event named
        after the final status (`done`, `failed`, `cancelled`) carrying the request view."""
        record = await ctx.owned_record(request_id, owner)

        async def events() -> AsyncIterator[bytes]:
            async for snapshot in follow_record(ctx, record.request_id):
                if snapshot.status in TERMINAL:
                    yield sse_event(_view(snapshot).model_dump(), event=snapshot.status)
                elif snapshot.progress is not None:
                    yield sse_event(
                        {"type": "progress", "status": snapshot.status, **snapshot.progress}, event="progress"
                    )

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/requests/{request_id}/cancel", tags=["requests"], responses=OPENAPI_RESPONSES)
    async def cancel_request(request_id: str, owner: str = Depends(authorize)) -> RequestView:
        """Stops a request wherever it runs; a finished request is left as it is."""
        await ctx.owned_record(request_id, owner)
        await ctx.requests.request_cancel(request_id)
        return _view(await ctx.requests.get(request_id))

    @app.get("/v1/requests/{request_id}/audio", tags=["requests"], responses=OPENAPI_RESPONSES)
    async def resume_audio(
        request_id: str,
        after_sequence: int | None = Query(None, ge=0, description="Last chunk sequence the client received."),
        offset_bytes: int = Query(0, ge=0, description="Raw audio resume: bytes already received."),
        stream_format: Literal["audio", "sse"] = "audio",
        last_event_id: int | None = Header(None, ge=0, description="SSE reconnect: same as after_sequence."),
        owner: str = Depends(authorize),
    ) -> StreamingResponse:
        """The request's output after `after_sequence` / `Last-Event-ID` / `offset_bytes` (journaled
        first, then live): the same bytes an uninterrupted stream would have carried from there on."""
        record = await ctx.owned_record(request_id, owner)
        after = after_sequence if after_sequence is not None else last_event_id
        followed = ctx.runs.follow(record.request_id, after)
        entries = await _started(skip_bytes(followed, offset_bytes), fail_early=stream_format == "audio")
        if stream_format == "sse":
            return StreamingResponse(as_sse(entries), media_type="text/event-stream")
        spec = FORMATS.get(record.response_format)
        media_type = spec.content_type if spec is not None else "application/octet-stream"
        return StreamingResponse(as_bytes(entries), media_type=media_type)

    add_voice_routes(app, ctx, authorize, require_json)
    return app

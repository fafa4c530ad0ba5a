"""The REST API (FastAPI). Handlers stay thin: auth, validation, then the gateway's orchestration.

Every error answers with the OpenAI envelope (`chorus.gateway.errors`). Endpoints that need
the speech or text-to-audio engines answer 503 while a backend has no healthy replica and 501
until the orchestration is wired to the engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from chorus.gateway.audio import FORMATS
from chorus.gateway.body_limit import BodyLimit
from chorus.gateway.context import GatewayContext
from chorus.gateway.errors import UnsupportedMediaType, envelope, install_error_handlers
from chorus.gateway.metrics import CountOutcomes
from chorus.gateway.ref_audio import resolve_ref_audio
from chorus.gateway.schemas import GenerationRequest, RequestView, SpeechRequest
from chorus.gateway.state.connection import REDIS_ERRORS
from chorus.gateway.state.journal import JournalEntry
from chorus.gateway.state.requests import RequestRecord
from chorus.gateway.streaming import as_bytes, as_sse, skip_bytes
from chorus.runtime.errors import NotImplementedYet

_ERROR_RESPONSES = {
    status: {"description": description, "content": {"application/json": {"example": envelope("…", kind)}}}
    for status, description, kind in (
        (400, "Invalid input; `param` names the field.", "invalid_request_error"),
        (401, "Missing or unknown API key.", "invalid_request_error"),
        (404, "Unknown model, voice or request.", "invalid_request_error"),
        (413, "Request body too large.", "invalid_request_error"),
        (422, "Body does not match the schema.", "invalid_request_error"),
        (429, "Admission full or rate limit hit; see Retry-After.", "rate_limit_error"),
        (503, "A backend or Redis is down; see Retry-After.", "server_error"),
    )
}


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
    )


async def _started(entries: AsyncIterator[JournalEntry]) -> AsyncIterator[JournalEntry]:
    """Reads the first entry now, so a refused resume (trimmed journal) is an error status, not a
    broken stream; then yields it and the rest."""
    first = await anext(entries, None)
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
    app.add_middleware(BodyLimit, max_body_bytes=config.max_body_bytes)
    app.add_middleware(CountOutcomes)

    async def authorize(request: Request) -> str:
        """The caller's key id ("" without auth), after its rate limit; 401 / 429 otherwise."""
        return await ctx.authorize(request.headers.get("authorization"))

    def require_json(request: Request) -> None:
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            raise UnsupportedMediaType(f"content-type must be application/json, got {content_type or 'none'!r}")

    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"])
    async def ready() -> JSONResponse:
        """Readiness: Redis answers and every backend has a healthy replica."""
        try:
            is_redis_up = bool(await asyncio.wait_for(ctx.redis.ping(), timeout=1.0))
        except (*REDIS_ERRORS, TimeoutError):
            is_redis_up = False
        is_ready = is_redis_up and ctx.backends.is_ready()
        body = {"ready": is_ready, "redis": is_redis_up, "backends": ctx.backends.status()}
        return JSONResponse(body, status_code=200 if is_ready else 503)

    @app.get("/metrics", tags=["operations"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics of this gateway replica."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.post(
        "/v1/audio/speech",
        tags=["speech"],
        responses=_ERROR_RESPONSES,
        dependencies=[Depends(require_json)],
        response_class=Response,
    )
    async def create_speech(body: SpeechRequest, owner: str = Depends(authorize)) -> Response:
        """Text → speech, OpenAI-compatible (streamed audio bytes or SSE events)."""
        body.check_limits(config.max_input_chars)
        if body.ref_audio is not None:
            await resolve_ref_audio(body.ref_audio, config.ref_audio_allowed_hosts, config.max_ref_audio_bytes)
        ctx.require_backends("talker", "vocoder")
        raise NotImplementedYet("speech synthesis is not available yet: the talker/vocoder pipeline is not wired")

    @app.post(
        "/v1/audio/generations",
        tags=["text-to-audio"],
        responses=_ERROR_RESPONSES,
        dependencies=[Depends(require_json)],
        response_class=Response,
    )
    async def create_generation(body: GenerationRequest, owner: str = Depends(authorize)) -> Response:
        """Prompt → audio (Stable Audio Open), synchronously or as a job (202 + request id)."""
        body.check_limits(config.max_input_chars)
        ctx.require_backends("diffusion")
        raise NotImplementedYet("text-to-audio is not available yet: the diffusion pipeline is not wired")

    @app.get("/v1/models", tags=["catalog"], responses=_ERROR_RESPONSES)
    async def list_models(owner: str = Depends(authorize)) -> Response:
        """The loaded models (from the talker and diffusion services), OpenAI list format."""
        ctx.require_backends("talker", "diffusion")
        raise NotImplementedYet("the model list is not available yet: the services' catalogs are not wired")

    @app.get("/v1/audio/voices", tags=["catalog"], responses=_ERROR_RESPONSES)
    async def list_voices(owner: str = Depends(authorize)) -> Response:
        """Speakers, task types and languages of the loaded talker checkpoint."""
        ctx.require_backends("talker")
        raise NotImplementedYet("the voice list is not available yet: the talker's ListVoices is not wired")

    @app.get("/v1/requests/{request_id}", tags=["requests"], responses=_ERROR_RESPONSES)
    async def get_request(request_id: str, owner: str = Depends(authorize)) -> RequestView:
        """Status, timings and usage of a request (any gateway replica can answer)."""
        return _view(await ctx.owned_record(request_id, owner))

    @app.post("/v1/requests/{request_id}/cancel", tags=["requests"], responses=_ERROR_RESPONSES)
    async def cancel_request(request_id: str, owner: str = Depends(authorize)) -> RequestView:
        """Stops a request wherever it runs; a finished request is left as it is."""
        await ctx.owned_record(request_id, owner)
        await ctx.requests.request_cancel(request_id)
        return _view(await ctx.requests.get(request_id))

    @app.get("/v1/requests/{request_id}/audio", tags=["requests"], responses=_ERROR_RESPONSES)
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
        entries = await _started(skip_bytes(ctx.journal.read(record.request_id, after), offset_bytes))
        if stream_format == "sse":
            return StreamingResponse(as_sse(entries), media_type="text/event-stream")
        spec = FORMATS.get(record.response_format)
        media_type = spec.content_type if spec is not None else "application/octet-stream"
        return StreamingResponse(as_bytes(entries), media_type=media_type)

    return app

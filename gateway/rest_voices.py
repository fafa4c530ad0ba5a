"""The REST routes of voices (`/v1/audio/voices`): list built-in and saved ones, save, get, delete.

Saving takes JSON (`audio` as base64 or a data: URI) or multipart/form-data (`audio` as a file); it
answers 201 with the voice. Saved voices are the caller's own: another API key's are not found.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Depends, FastAPI, Query
from fastapi.responses import JSONResponse

from chorus.gateway import proto_convert
from chorus.gateway.context import GatewayContext
from chorus.gateway.errors import OPENAPI_RESPONSES
from chorus.gateway.multipart_forms import multipart_openapi
from chorus.gateway.ref_audio import resolve_ref_audio
from chorus.gateway.schemas import CreateVoiceRequest, VoiceList, VoiceView
from chorus.gateway.state.voices import Voice
from chorus.gateway.voices import MAX_PAGE_SIZE
from chorus.runtime.logs import REQUEST_ID_HEADER, new_request_id, request_id_var


def voice_view(voice: Voice) -> VoiceView:
    is_clone = voice.kind == "clone"
    return VoiceView(
        id=voice.voice_id,
        name=voice.name,
        kind=voice.kind,
        model=voice.model,
        created_at=None if voice.created_at_s is None else int(voice.created_at_s),
        language=voice.language or None,
        ref_text=voice.ref_text or None,
        ref_duration_s=voice.ref_duration_s if is_clone else None,
        x_vector_only=voice.x_vector_only if is_clone else None,
        instructions=voice.instructions or None,
    )


def _log_as_new_request() -> str:
    """A request id for the logs of a voice being saved or deleted (and for the backends' logs)."""
    request_id = new_request_id()
    request_id_var.set(request_id)
    return request_id


def add_voice_routes(
    app: FastAPI, ctx: GatewayContext, authorize: Callable[..., Awaitable[str]], require_json: Callable[..., None]
) -> None:
    config = ctx.config

    @app.post(
        "/v1/audio/voices",
        tags=["voices"],
        status_code=201,
        responses=OPENAPI_RESPONSES,
        dependencies=[Depends(require_json)],
        openapi_extra=multipart_openapi(CreateVoiceRequest, "audio", "Reference audio file of the voice."),
    )
    async def create_voice(body: CreateVoiceRequest, owner: str = Depends(authorize)) -> JSONResponse:
        """Saves a voice: cloned from reference audio (`audio`, with `ref_text` for in-context cloning or
        `x_vector_only`), or designed from `instructions` alone. Its codes and speaker embedding are computed
        once, here; `voice: "<name or id>"` in speech requests then uses them. The body is JSON, or
        multipart/form-data with `audio` as a file."""
        request_id = _log_as_new_request()
        audio = None
        if body.audio is not None:
            audio = await resolve_ref_audio(
                body.audio, config.ref_audio_allowed_hosts, config.max_ref_audio_bytes, param="audio"
            )
        voice = await ctx.voices.create(owner, body, audio)
        headers = {"Location": f"/v1/audio/voices/{voice.voice_id}", REQUEST_ID_HEADER: request_id}
        return JSONResponse(voice_view(voice).model_dump(), status_code=201, headers=headers)

    @app.get("/v1/audio/voices", tags=["voices"], responses=OPENAPI_RESPONSES)
    async def list_voices(
        after: str | None = Query(None, description="List after this voice id (the previous page's `last_id`)."),
        limit: int = Query(MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
        owner: str = Depends(authorize),
    ) -> VoiceList:
        """The talker's built-in speakers, then your saved voices (oldest first), a page at a time."""
        ctx.require_backends("talker")
        voices, has_more = await ctx.voices.page(owner, after, limit)
        talker = await ctx.catalog.voices()
        return VoiceList(
            data=[voice_view(voice) for voice in voices],
            first_id=voices[0].voice_id if voices else None,
            last_id=voices[-1].voice_id if voices else None,
            has_more=has_more,
            model=talker.model,
            voices=list(talker.speakers),
            task_types=[proto_convert.task_type_name(task_type) for task_type in talker.task_types],
            languages=list(talker.languages),
        )

    @app.get("/v1/audio/voices/{voice}", tags=["voices"], responses=OPENAPI_RESPONSES)
    async def get_voice(voice: str, owner: str = Depends(authorize)) -> VoiceView:
        """One voice, by id or name: yours, or a built-in speaker."""
        return voice_view(await ctx.voices.get(owner, voice))

    @app.delete("/v1/audio/voices/{voice}", tags=["voices"], responses=OPENAPI_RESPONSES)
    async def delete_voice(voice: str, owner: str = Depends(authorize)) -> dict:
        """Deletes one of your saved voices, by id or name."""
        _log_as_new_request()
        deleted = await ctx.voices.delete(owner, voice)
        return {"id": deleted.voice_id, "object": "audio.voice.deleted", "deleted": True}

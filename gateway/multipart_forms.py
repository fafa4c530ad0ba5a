"""Uploads as multipart/form-data: `POST /v1/audio/speech` (`ref_audio` as a file) and `POST /v1/audio/voices`
(`audio` as a file) take the fields of their JSON body as form fields.

An ASGI middleware turns such a request into the JSON body it stands for (the file as base64,
`sampling` as the JSON object its field holds) before the app sees it, so both encodings pass
through one schema, one validation and one error envelope. The body size limit (413) applies to
the upload as sent; a file over `max_file_bytes` is a 413 naming its field.
"""

from __future__ import annotations

import base64
import json

from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chorus.gateway.errors import InvalidParam, PayloadTooLarge, response_for
from chorus.runtime.errors import ChorusError, InvalidRequest

# The routes that take an upload → the field their file goes in.
FILE_FIELDS = {"/v1/audio/speech": "ref_audio", "/v1/audio/voices": "audio"}


def multipart_openapi(schema: type[BaseModel], file_field: str, description: str) -> dict:
    """The multipart/form-data request body of an upload route, for its OpenAPI operation."""
    properties: dict[str, dict] = {name: {"type": "string"} for name in schema.model_fields}
    properties[file_field] = {"type": "string", "format": "binary", "description": description}
    if "sampling" in properties:
        properties["sampling"] = {"type": "string", "description": "SamplingParams as a JSON object."}
    required = [name for name, field in schema.model_fields.items() if field.is_required()]
    form = {"type": "object", "required": required, "properties": properties}
    return {"requestBody": {"content": {"multipart/form-data": {"schema": form}}}}


def _is_multipart(scope: Scope) -> bool:
    content_type = dict(scope["headers"]).get(b"content-type", b"")
    return content_type.split(b";")[0].strip().lower() == b"multipart/form-data"


async def _json_fields(form: FormData, file_field: str, max_file_bytes: int) -> dict:
    fields: dict = {}
    for name, value in form.multi_items():
        if name in fields:
            raise InvalidParam(name, "is given more than once")
        if isinstance(value, UploadFile):
            if name != file_field:
                raise InvalidParam(name, "must be a form field, not a file")
            if value.size is not None and value.size > max_file_bytes:
                raise PayloadTooLarge(f"{name}: the file is larger than {max_file_bytes} bytes")
            fields[name] = base64.b64encode(await value.read()).decode()
        elif name == "sampling":
            try:
                fields[name] = json.loads(value)
            except json.JSONDecodeError:
                raise InvalidParam("sampling", "must hold a JSON object") from None
        else:
            fields[name] = value
    return fields


class MultipartForms:
    def __init__(self, app: ASGIApp, max_file_bytes: int, max_field_bytes: int) -> None:
        self.app = app
        self.max_file_bytes = max_file_bytes
        self.max_field_bytes = max_field_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        file_field = FILE_FIELDS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if file_field is None or scope["method"] != "POST" or not _is_multipart(scope):
            await self.app(scope, receive, send)
            return
        try:
            async with Request(scope, receive).form(max_part_size=self.max_field_bytes) as form:
                body = json.dumps(await _json_fields(form, file_field, self.max_file_bytes)).encode()
        except (HTTPException, MultiPartException) as exc:
            await response_for(InvalidRequest(f"malformed multipart body: {getattr(exc, 'detail', exc)}"))(
                scope, receive, send
            )
            return
        except ChorusError as exc:
            await response_for(exc)(scope, receive, send)
            return
        headers = [(key, value) for key, value in scope["headers"] if key not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        is_body_sent = False

        async def replay() -> Message:
            nonlocal is_body_sent
            if not is_body_sent:
                is_body_sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the client's disconnect, for streaming responses

        await self.app(dict(scope, headers=headers), replay, send)

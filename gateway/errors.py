"""Errors as the OpenAI API shapes them: `{"error": {"message", "type", "param", "code"}}`.

Every error path of the REST app ends here: the runtime's typed errors, FastAPI's schema
errors, Starlette's HTTP errors (unknown route, wrong method) and anything unexpected (500,
generic message: tracebacks never reach clients).
"""

from __future__ import annotations

import logging
import math

import grpc
import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from chorus.runtime.errors import (
    ChorusError,
    InvalidRequest,
    NotFound,
    NotImplementedYet,
    Overloaded,
    Unavailable,
)

log = logging.getLogger("chorus.gateway.errors")

# pydantic error types that mean "the body does not have the schema's shape" (422): missing or
# unknown fields, wrong JSON types. Every other validation error is a bad value in a well-formed
# body (400, as OpenAI answers it), e.g. a number out of range or an unknown enum value.
_SCHEMA_ERROR_TYPES = ("missing", "extra_forbidden", "json_invalid")
_SCHEMA_ERROR_SUFFIXES = ("_type", "_parsing")


def _is_schema_error(error_type: str) -> bool:
    return error_type in _SCHEMA_ERROR_TYPES or error_type.endswith(_SCHEMA_ERROR_SUFFIXES)


class InvalidParam(InvalidRequest):
    """A bad value in one request field; `param` names it (dotted path for nested fields)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class Unauthorized(ChorusError):
    """No API key, or one that is not configured."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PayloadTooLarge(InvalidRequest):
    pass


class AlreadyExists(ChorusError):
    """The value of `param` is taken (a voice name: one of the owner's saved voices, or a built-in speaker)."""

    code = grpc.StatusCode.ALREADY_EXISTS

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


class LimitReached(ChorusError):
    """A per-key quota is used up (saved voices): retrying will not help, freeing some will."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class UnsupportedMediaType(InvalidRequest):
    pass


class RequestCancelled(ChorusError):
    """The request was cancelled (by a cancel call, on any replica) before it finished."""

    code = grpc.StatusCode.CANCELLED


class UpstreamFailed(ChorusError):
    """A backend failed the request after it started; the message says how (shown to the client)."""

    code = grpc.StatusCode.UNAVAILABLE


_ERRORS_BY_CODE = {
    "INVALID_ARGUMENT": InvalidRequest,
    "NOT_FOUND": NotFound,
    "CANCELLED": RequestCancelled,
    "UNAVAILABLE": Unavailable,
    "RESOURCE_EXHAUSTED": Overloaded,
}


def error_for_outcome(status: str, error: dict | None) -> ChorusError:
    """The typed error for a request that ended `failed` or `cancelled` (its record's `error`)."""
    error = error or {}
    code = error.get("code") or ("CANCELLED" if status == "cancelled" else "INTERNAL")
    return _ERRORS_BY_CODE.get(code, UpstreamFailed)(error.get("message") or f"request {status}")


def envelope(message: str, error_type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


# The error answers every REST operation documents in the OpenAPI schema.
OPENAPI_RESPONSES = {
    status: {"description": description, "content": {"application/json": {"example": envelope("…", kind)}}}
    for status, description, kind in (
        (400, "Invalid input; `param` names the field.", "invalid_request_error"),
        (401, "Missing or unknown API key.", "invalid_request_error"),
        (404, "Unknown model, voice or request.", "invalid_request_error"),
        (409, "The voice name is taken.", "invalid_request_error"),
        (413, "Request body too large.", "invalid_request_error"),
        (422, "Body does not match the schema.", "invalid_request_error"),
        (429, "Admission full or rate limit hit; see Retry-After.", "rate_limit_error"),
        (503, "A backend or Redis is down; see Retry-After.", "server_error"),
    )
}


def error_response(
    status_code: int,
    message: str,
    error_type: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(envelope(message, error_type, param, code), status_code=status_code, headers=headers)


def response_for(exc: ChorusError) -> JSONResponse:
    """The HTTP answer for a typed error raised anywhere below a handler."""
    message = str(exc)
    if isinstance(exc, PayloadTooLarge):
        return error_response(413, message, "invalid_request_error", code="request_too_large")
    if isinstance(exc, UnsupportedMediaType):
        return error_response(415, message, "invalid_request_error", code="unsupported_media_type")
    if isinstance(exc, InvalidRequest):
        return error_response(400, message, "invalid_request_error", param=getattr(exc, "param", None))
    if isinstance(exc, Unauthorized):
        return error_response(401, message, "invalid_request_error", code="invalid_api_key")
    if isinstance(exc, NotFound):
        return error_response(404, message, "invalid_request_error", code="not_found")
    if isinstance(exc, AlreadyExists):
        return error_response(409, message, "invalid_request_error", param=exc.param, code="already_exists")
    if isinstance(exc, LimitReached):
        return error_response(400, message, "invalid_request_error", code="limit_reached")
    if isinstance(exc, Overloaded):
        retry_after_s = str(max(1, math.ceil(exc.retry_after_s)))
        headers = {"Retry-After": retry_after_s}
        return error_response(429, message, "rate_limit_error", code="rate_limit_exceeded", headers=headers)
    if isinstance(exc, Unavailable):
        return error_response(503, message, "server_error", code="unavailable", headers={"Retry-After": "1"})
    if isinstance(exc, RequestCancelled):
        return error_response(409, message, "invalid_request_error", code="cancelled")
    if isinstance(exc, UpstreamFailed):
        return error_response(502, message, "server_error", code="upstream_failed")
    if isinstance(exc, NotImplementedYet):
        return error_response(501, message, "server_error", code="not_implemented")
    return _internal_error()


def _param_of(location: tuple) -> str | None:
    # location is ("body", "field", 0, "sub") for body errors; the first element is where it came from.
    path = [str(part) for part in location[1:]]
    return ".".join(path) or None


def invalid_param_from(exc: pydantic.ValidationError) -> InvalidParam:
    """The first problem of a schema validation, as the InvalidParam the gRPC API raises."""
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or "request"
    return InvalidParam(param, first["msg"])


def response_for_validation(exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0]
    is_schema_error = any(_is_schema_error(error["type"]) for error in exc.errors())
    if first["type"] == "json_invalid":  # its location is a character offset, not a field
        return error_response(422, "request body is not valid JSON", "invalid_request_error")
    param = _param_of(tuple(first.get("loc", ())))
    message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return error_response(422 if is_schema_error else 400, message, "invalid_request_error", param=param)


def _internal_error() -> JSONResponse:
    return error_response(500, "internal error", "server_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ChorusError)
    async def _typed(request: Request, exc: ChorusError) -> JSONResponse:
        return response_for(exc)

    @app.exception_handler(RequestValidationError)
    async def _schema(request: Request, exc: RequestValidationError) -> JSONResponse:
        return response_for_validation(exc)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        return error_response(exc.status_code, str(exc.detail), error_type, code=code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _internal_error()

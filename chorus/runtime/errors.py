"""Typed errors raised by services and the gateway, and the gRPC status each one maps to.

Handlers raise these; the error boundary (`chorus.runtime.boundary`) turns them into statuses.
Anything else becomes INTERNAL with a generic message: tracebacks never reach clients.
"""

from __future__ import annotations

import grpc


class ChorusError(Exception):
    """Base for errors whose message is safe to show to the client."""

    code = grpc.StatusCode.INTERNAL


class InvalidRequest(ChorusError, ValueError):
    """The request is malformed or out of range; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ChorusError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class Overloaded(ChorusError):
    """Admission refused: queues are full. Clients should retry after `retry_after_s`."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(ChorusError):
    """A dependency (a backend, Redis) is down, or this process is draining."""

    code = grpc.StatusCode.UNAVAILABLE


class NotImplementedYet(ChorusError):
    """A capability whose engine is not built into this process."""

    code = grpc.StatusCode.UNIMPLEMENTED


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and client-safe message for an exception raised by a handler."""
    if isinstance(exc, ChorusError):
        return exc.code, str(exc)
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error"

"""The error boundary: one server interceptor that every Chorus gRPC server installs.

For each call it sets the request id (from `x-request-id` metadata, or a fresh one) in the logging
context, maps exceptions to status codes (`chorus.runtime.errors.status_for`), logs each failure
once, and records call counts and durations. Handlers therefore just raise typed errors.
Health and reflection calls pass through untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from chorus.runtime.errors import status_for
from chorus.runtime.logs import REQUEST_ID_HEADER, new_request_id, request_id_var
from chorus.runtime.metrics import RPC_SECONDS, RPCS, RPCS_IN_FLIGHT

log = logging.getLogger("chorus.rpc")


class _CallScope:
    """Per-call bookkeeping: request id, timing, outcome metrics, failure logging."""

    def __init__(self, service: str, method: str, context: grpc.aio.ServicerContext) -> None:
        self.service = service
        self.method = method
        self.context = context
        metadata = dict(context.invocation_metadata() or ())
        self.request_id = metadata.get(REQUEST_ID_HEADER) or new_request_id()

    def __enter__(self) -> _CallScope:
        request_id_var.set(self.request_id)
        self.context.set_trailing_metadata(((REQUEST_ID_HEADER, self.request_id),))
        self.started = time.perf_counter()
        RPCS_IN_FLIGHT.labels(self.service).inc()
        self.code = grpc.StatusCode.OK
        return self

    def __exit__(self, *exc_info: object) -> None:
        RPCS_IN_FLIGHT.labels(self.service).dec()
        RPC_SECONDS.labels(self.service, self.method).observe(time.perf_counter() - self.started)
        RPCS.labels(self.service, self.method, self.code.name).inc()

    async def fail(self, exc: Exception) -> None:
        """Ends the call with the status `exc` maps to; never returns."""
        if isinstance(exc, grpc.aio.AbortError):  # the handler aborted with its own status
            self.code = self.context.code() or grpc.StatusCode.UNKNOWN
            raise exc
        self.code, message = status_for(exc)
        if self.code == grpc.StatusCode.INTERNAL:
            log.error("%s failed", self.method, exc_info=exc)
        else:
            log.info("%s → %s: %s", self.method, self.code.name, message)
        await self.context.abort(self.code, message)

    def cancelled(self) -> None:
        self.code = grpc.StatusCode.CANCELLED
        log.info("%s cancelled by the client", self.method)


def _wrap_unary_response(scope_for: Callable[..., _CallScope], behavior: Callable[..., Awaitable[Any]]):
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with scope_for(context) as scope:
            try:
                return await behavior(request, context)
            except asyncio.CancelledError:
                scope.cancelled()
                raise
            except Exception as exc:
                await scope.fail(exc)

    return call


def _wrap_stream_response(scope_for: Callable[..., _CallScope], behavior: Callable[..., AsyncIterator[Any]]):
    async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        with scope_for(context) as scope:
            try:
                async for message in behavior(request, context):
                    yield message
            except asyncio.CancelledError:
                scope.cancelled()
                raise
            except Exception as exc:
                await scope.fail(exc)

    return call


class ErrorBoundary(grpc.aio.ServerInterceptor):
    def __init__(self, service: str) -> None:
        self.service = service

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith("/grpc."):
            return handler
        short_method = method.rsplit("/", 1)[-1]

        def scope_for(context: grpc.aio.ServicerContext) -> _CallScope:
            return _CallScope(self.service, short_method, context)

        kind = (handler.request_streaming, handler.response_streaming)
        if kind == (False, False):
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary_response(scope_for, handler.unary_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if kind == (True, False):
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary_response(scope_for, handler.stream_unary),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if kind == (False, True):
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream_response(scope_for, handler.unary_stream),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream_response(scope_for, handler.stream_stream),
            handler.request_deserializer,
            handler.response_serializer,
        )

"""Refuses request bodies over a size limit (413) before they are buffered.

A declared Content-Length over the limit is answered at once; a chunked body is counted as it
arrives and cut off when it crosses the limit, so a client cannot make the gateway buffer more.
"""

from __future__ import annotations

import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chorus.gateway.errors import PayloadTooLarge, response_for


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"request body is larger than {self.max_body_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await response_for(self._too_large())(scope, receive, send)
            return
        num_bytes = 0
        is_too_large = False
        has_started = False

        async def counting_receive() -> Message:
            nonlocal num_bytes, is_too_large
            message = await receive()
            if message["type"] == "http.request":
                num_bytes += len(message.get("body", b""))
                if num_bytes > self.max_body_bytes:
                    is_too_large = True
                    raise self._too_large()
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal has_started
            # Whatever the app answers to the aborted body (FastAPI says 400) is replaced by the 413.
            if not is_too_large or has_started:
                has_started = True
                await send(message)

        with contextlib.suppress(PayloadTooLarge):
            await self.app(scope, counting_receive, guarded_send)
        if is_too_large and not has_started:
            await response_for(self._too_large())(scope, receive, send)

"""One exception family for every client call: the gateway could not be reached, or it answered an error."""

from __future__ import annotations

import grpc
import httpx


class ChorusError(Exception):
    """Base of every error the client raises."""


class GatewayUnreachable(ChorusError):
    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"cannot reach the Chorus gateway at {where}: {reason}")


class APIError(ChorusError):
    """An error answer: HTTP status (or gRPC code) with the OpenAI envelope's fields."""

    def __init__(self, status: int | str, message: str, type: str | None = None, code: str | None = None,
                 param: str | None = None, request_id: str | None = None) -> None:  # fmt: skip
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.request_id = request_id
        suffix = f" (request {request_id})" if request_id else ""
        super().__init__(f"{status}: {message}{suffix}")


def raise_for_reply(reply: httpx.Response) -> None:
    """`APIError` from an error reply's OpenAI envelope (or its text when it has none)."""
    if reply.status_code < 400:
        return
    try:
        error = reply.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = {"message": reply.text or reply.reason_phrase}
    raise APIError(
        reply.status_code, error.get("message", ""), error.get("type"), error.get("code"), error.get("param"),
        reply.headers.get("x-request-id"),
    )  # fmt: skip


def from_rpc_error(error: grpc.RpcError, target: str) -> ChorusError:
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return GatewayUnreachable(target, error.details() or "unavailable")
    metadata = dict(error.trailing_metadata() or ())
    return APIError(error.code().name, error.details() or "", request_id=metadata.get("x-request-id"))

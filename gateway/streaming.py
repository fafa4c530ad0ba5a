"""Journal entries → what a client receives: raw audio bytes, SSE events, or public gRPC messages.

SSE follows the OpenAI speech API (`speech.audio.delta` with base64 audio, then
`speech.audio.done` with usage). Each delta carries `id: <sequence>`, so a browser's EventSource
reconnects with `Last-Event-ID` and resumes after the last chunk it got.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator

from chorus.gateway.state.journal import JournalEntry
from chorus.gateway.state.requests import CANCELLED, DONE
from chorus.runtime.errors import ChorusError
from chorus.v1 import common_pb2, gateway_pb2


class StreamEnded(ChorusError):
    """The request failed or was cancelled after its stream began; the client must not take the
    partial audio as complete (raw audio streams are cut off rather than closed cleanly)."""


def _failure(final: dict) -> StreamEnded:
    error = final.get("error") or {}
    message = error.get("message") or f"request ended as {final['status']}"
    return StreamEnded(message)


def sse_event(data: dict, event_id: int | None = None, event: str | None = None) -> bytes:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append("data: " + json.dumps(data, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


async def _ended(entries: AsyncIterator[JournalEntry]) -> AsyncIterator[JournalEntry]:
    """`entries`, which must end with the end marker: a stream that stopped without one raises StreamEnded rather
    than end as if its audio were whole (journal readers always end with one; this keeps it so)."""
    async with contextlib.aclosing(entries):
        async for entry in entries:
            yield entry
            if entry.final is not None:
                return
    raise StreamEnded("the request's output ended without its end marker")


async def as_bytes(entries: AsyncIterator[JournalEntry]) -> AsyncIterator[bytes]:
    """The audio bytes; raises StreamEnded (so the HTTP server drops the connection) on failure."""
    async for entry in _ended(entries):
        if entry.final is None:
            yield entry.data
        elif entry.final["status"] != DONE:
            raise _failure(entry.final)


async def as_sse(entries: AsyncIterator[JournalEntry]) -> AsyncIterator[bytes]:
    async for entry in _ended(entries):
        if entry.final is None:
            delta = {"type": "speech.audio.delta", "audio": base64.b64encode(entry.data).decode()}
            yield sse_event(delta, event_id=entry.sequence)
        elif entry.final["status"] == DONE:
            yield sse_event({"type": "speech.audio.done", "usage": entry.final.get("usage") or {}})
        else:
            error = entry.final.get("error") or {}
            envelope = {
                "message": error.get("message") or f"request {entry.final['status']}",
                "type": "server_error",
                "param": None,
                "code": error.get("code") or entry.final["status"],
            }
            yield sse_event({"type": "error", "error": envelope}, event="error")


def finish_reason(final: dict, kind: str) -> int:
    if final["status"] == DONE:
        return common_pb2.FINISH_REASON_EOS if kind == "speech" else common_pb2.FINISH_REASON_COMPLETE
    if final["status"] == CANCELLED:
        return common_pb2.FINISH_REASON_CANCELLED
    return common_pb2.FINISH_REASON_ERROR


def final_message(final: dict, kind: str) -> common_pb2.Final:
    """A journal end marker as the public API's Final (reason, usage, error)."""
    message = common_pb2.Final(reason=finish_reason(final, kind))
    usage = final.get("usage") or {}
    message.usage.audio_s = usage.get("audio_s", 0.0)
    message.usage.num_steps = usage.get("num_steps", 0)
    if final.get("error"):
        message.error.code = final["error"].get("code", "")
        message.error.message = final["error"].get("message", "")
    return message


async def as_speak_outputs(
    request_id: str, kind: str, entries: AsyncIterator[JournalEntry]
) -> AsyncIterator[gateway_pb2.SpeakOutput]:
    """The public API's stream: the request id, the audio, then one Final."""
    yield gateway_pb2.SpeakOutput(request_id=request_id)
    async for entry in _ended(entries):
        if entry.final is None:
            yield gateway_pb2.SpeakOutput(audio=gateway_pb2.AudioData(data=entry.data, sequence=entry.sequence))
            continue
        yield gateway_pb2.SpeakOutput(final=final_message(entry.final, kind))


async def skip_bytes(entries: AsyncIterator[JournalEntry], num_bytes: int) -> AsyncIterator[JournalEntry]:
    """Drops the first `num_bytes` audio bytes: resume of a raw audio stream by byte offset, since
    HTTP chunk boundaries do not tell a client which sequence it got up to."""
    async for entry in entries:
        if entry.final is None and num_bytes > 0:
            skipped = min(num_bytes, len(entry.data))
            num_bytes -= skipped
            if skipped == len(entry.data):
                continue
            entry = JournalEntry(entry.sequence, entry.data[skipped:])
        yield entry

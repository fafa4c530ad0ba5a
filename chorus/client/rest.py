"""REST client (httpx): `Client` (blocking) and `AsyncClient`, the same verbs.

Base URL from the argument, `CHORUS_URL` or `http://127.0.0.1:8000`; API key from the argument or
`CHORUS_API_KEY`. Streaming speech yields raw audio pieces; the stream object keeps the request id and the bytes
received, which is all `resume` needs to continue a cut stream byte-identically. Calls that get a whole answer are
tried again when the gateway refuses them for now or cannot be reached (`retries`; `max_retries=0`: never).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import httpx

from chorus.client import retries
from chorus.client.errors import GatewayUnreachable, raise_for_reply


def _settings(base_url: str | None, api_key: str | None) -> tuple[str, dict]:
    url = base_url or os.environ.get("CHORUS_URL", "http://127.0.0.1:8000")
    key = api_key or os.environ.get("CHORUS_API_KEY")
    return url, ({"authorization": f"Bearer {key}"} if key else {})


def speech_body(text: str, model: str | None, voice: str | None, response_format: str, **extensions) -> dict:
    fields = {"voice": voice, **extensions}
    body = {"model": model or "", "input": text, "response_format": response_format}
    return body | {name: value for name, value in fields.items() if value is not None}


def voice_path(voice: str) -> str:
    return "/v1/audio/voices/" + urllib.parse.quote(voice, safe="")


def voice_upload(name: str, audio: bytes | None, **fields) -> dict:
    """httpx arguments of `POST /v1/audio/voices`: multipart with the audio file, or JSON for a designed voice."""
    fields = {"name": name} | {field: value for field, value in fields.items() if value not in (None, False)}
    if audio is None:
        return {"json": fields}
    form = {field: "true" if value is True else str(value) for field, value in fields.items()}
    return {"data": form, "files": {"audio": ("reference", audio)}}


class SpeechStream:
    """What a streaming speech call received so far: its request id and byte count."""

    def __init__(self) -> None:
        self.request_id: str | None = None
        self.bytes_received = 0


class Client:
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = retries.DEFAULT_MAX_RETRIES,
    ) -> None:
        self.base_url, headers = _settings(base_url, api_key)
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self._model: str | None = None
        self.max_retries = max_retries

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        for attempt in itertools.count():
            request = self._http.build_request(method, path, **kwargs)
            try:
                outcome = self._http.send(request)
            except httpx.TransportError as exc:
                outcome = exc
            if not retries.should_retry(attempt, self.max_retries, request, outcome):
                break
            time.sleep(retries.delay_s(attempt, outcome))
        if isinstance(outcome, Exception):
            raise GatewayUnreachable(self.base_url, str(outcome) or type(outcome).__name__) from None
        raise_for_reply(outcome)
        return outcome

    def models(self) -> list[dict]:
        return self._call("GET", "/v1/models").json()["data"]

    def voices(self, after: str | None = None, limit: int | None = None) -> dict:
        """A page of voices: built-in speakers, then yours (`data`, `has_more`, `last_id` for `after`)."""
        params = {name: value for name, value in (("after", after), ("limit", limit)) if value is not None}
        return self._call("GET", "/v1/audio/voices", params=params).json()

    def create_voice(self, name: str, audio: bytes | None = None, **fields) -> dict:
        """Saves a voice from `audio` (an audio file's bytes; fields: ref_text, language, x_vector_only) or from
        `instructions` alone; use it as `voice=name`."""
        return self._call("POST", "/v1/audio/voices", **voice_upload(name, audio, **fields)).json()

    def voice(self, voice: str) -> dict:
        return self._call("GET", voice_path(voice)).json()

    def delete_voice(self, voice: str) -> dict:
        return self._call("DELETE", voice_path(voice)).json()

    def status(self, request_id: str) -> dict:
        return self._call("GET", f"/v1/requests/{request_id}").json()

    def cancel(self, request_id: str) -> dict:
        return self._call("POST", f"/v1/requests/{request_id}/cancel").json()

    def _speech_model(self, model: str | None) -> str:
        if model is None and self._model is None:
            self._model = self.models()[0]["id"]
        return model or self._model

    def speech(self, text: str, *, model=None, voice=None, response_format="wav", **extensions) -> bytes:
        """The whole audio file of `text` (extensions: language, instructions, ref_audio, seed, …)."""
        body = speech_body(text, self._speech_model(model), voice, response_format, **extensions)
        return self._call("POST", "/v1/audio/speech", json=body, headers=_idempotency()).content

    @contextlib.contextmanager
    def stream_speech(self, text: str, *, model=None, voice=None, response_format="pcm", **extensions):
        """`with client.stream_speech(...) as (stream, pieces)`: audio pieces as they are made. A stream cut midway
        (the gateway process serving it died) goes on from the bytes received, through any process answering at
        the base URL: `max_retries` times, after 0.5 s doubling."""
        body = speech_body(text, self._speech_model(model), voice, response_format, **extensions)
        state = SpeechStream()
        try:
            with self._http.stream("POST", "/v1/audio/speech", json=body, headers=_idempotency()) as reply:
                if reply.status_code >= 400:
                    reply.read()
                raise_for_reply(reply)
                state.request_id = reply.headers.get("x-request-id")
                yield state, self._continued(_counted(reply.iter_bytes(), state), state)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(self.base_url, str(exc) or type(exc).__name__) from None

    def _continued(self, pieces: Iterator[bytes], state: SpeechStream) -> Iterator[bytes]:
        for attempt in itertools.count():
            try:
                yield from pieces
                return
            except (httpx.TransportError, GatewayUnreachable) as cut:
                if state.request_id is None or attempt >= self.max_retries:
                    raise
                time.sleep(retries.delay_s(attempt, cut))
                pieces = _counted(self.resume(state.request_id, state.bytes_received), state)

    def resume(self, request_id: str, offset_bytes: int = 0) -> Iterator[bytes]:
        """The rest of a speech stream after `offset_bytes` already received (journaled, then live)."""
        try:
            with self._http.stream(
                "GET", f"/v1/requests/{request_id}/audio", params={"offset_bytes": offset_bytes}
            ) as r:
                if r.status_code >= 400:
                    r.read()
                raise_for_reply(r)
                yield from r.iter_bytes()
        except httpx.TransportError as exc:
            raise GatewayUnreachable(self.base_url, str(exc) or type(exc).__name__) from None

    def generate(self, prompt: str, *, on_progress: Callable[[int, int], None] | None = None,
                 response_format: str = "wav", **fields) -> bytes:  # fmt: skip
        """Text → audio: starts an async job, reports `on_progress(step, num_steps)`, returns the audio file."""
        body = {"model": "stable-audio-open-1.0", "prompt": prompt, "response_format": response_format, "mode": "async"}
        job = self._call("POST", "/v1/audio/generations", json=body | fields, headers=_idempotency()).json()
        request_id = job["id"]
        with self._http.stream("GET", f"/v1/requests/{request_id}/events") as events:
            for event in _sse_data(events.iter_lines()):
                if event.get("type") == "progress" and on_progress is not None:
                    on_progress(event["step"], event["num_steps"])
                elif "status" in event and event["status"] in ("done", "failed", "cancelled"):
                    break
        return self._call("GET", f"/v1/requests/{request_id}/audio").content


class AsyncClient:
    """The same verbs as `Client`, awaitable."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        max_retries: int = retries.DEFAULT_MAX_RETRIES,
    ) -> None:
        self.base_url, headers = _settings(base_url, api_key)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.max_retries = max_retries

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        for attempt in itertools.count():
            request = self._http.build_request(method, path, **kwargs)
            try:
                outcome = await self._http.send(request)
            except httpx.TransportError as exc:
                outcome = exc
            if not retries.should_retry(attempt, self.max_retries, request, outcome):
                break
            await asyncio.sleep(retries.delay_s(attempt, outcome))
        if isinstance(outcome, Exception):
            raise GatewayUnreachable(self.base_url, str(outcome) or type(outcome).__name__) from None
        raise_for_reply(outcome)
        return outcome

    async def models(self) -> list[dict]:
        return (await self._call("GET", "/v1/models")).json()["data"]

    async def voices(self, after: str | None = None, limit: int | None = None) -> dict:
        params = {name: value for name, value in (("after", after), ("limit", limit)) if value is not None}
        return (await self._call("GET", "/v1/audio/voices", params=params)).json()

    async def create_voice(self, name: str, audio: bytes | None = None, **fields) -> dict:
        return (await self._call("POST", "/v1/audio/voices", **voice_upload(name, audio, **fields))).json()

    async def voice(self, voice: str) -> dict:
        return (await self._call("GET", voice_path(voice))).json()

    async def delete_voice(self, voice: str) -> dict:
        return (await self._call("DELETE", voice_path(voice))).json()

    async def status(self, request_id: str) -> dict:
        return (await self._call("GET", f"/v1/requests/{request_id}")).json()

    async def cancel(self, request_id: str) -> dict:
        return (await self._call("POST", f"/v1/requests/{request_id}/cancel")).json()

    async def speech(self, text: str, *, model=None, voice=None, response_format="wav", **extensions) -> bytes:
        model = model or (await self.models())[0]["id"]
        body = speech_body(text, model, voice, response_format, **extensions)
        return (await self._call("POST", "/v1/audio/speech", json=body, headers=_idempotency())).content

    async def stream_speech(self, text: str, *, model=None, voice=None, response_format="pcm",
                            **extensions) -> AsyncIterator[bytes]:  # fmt: skip
        """Audio pieces as they are made; a stream cut midway goes on as `Client.stream_speech`'s does."""
        model = model or (await self.models())[0]["id"]
        body = speech_body(text, model, voice, response_format, **extensions)
        state = SpeechStream()
        for attempt in itertools.count():
            try:
                if state.request_id is None:
                    request = self._http.build_request("POST", "/v1/audio/speech", json=body, headers=_idempotency())
                else:
                    params = {"offset_bytes": state.bytes_received}
                    request = self._http.build_request("GET", f"/v1/requests/{state.request_id}/audio", params=params)
                reply = await self._http.send(request, stream=True)
                try:
                    if reply.status_code >= 400:
                        await reply.aread()
                    raise_for_reply(reply)
                    state.request_id = state.request_id or reply.headers.get("x-request-id")
                    async for piece in reply.aiter_bytes():
                        state.bytes_received += len(piece)
                        yield piece
                    return
                finally:
                    await reply.aclose()
            except httpx.TransportError as cut:
                if state.request_id is None or attempt >= self.max_retries:
                    raise GatewayUnreachable(self.base_url, str(cut) or type(cut).__name__) from None
                await asyncio.sleep(retries.delay_s(attempt, cut))

    async def resume(self, request_id: str, offset_bytes: int = 0) -> AsyncIterator[bytes]:
        """The rest of a speech stream after `offset_bytes` already received (journaled, then live)."""
        try:
            async with self._http.stream(
                "GET", f"/v1/requests/{request_id}/audio", params={"offset_bytes": offset_bytes}
            ) as reply:
                if reply.status_code >= 400:
                    await reply.aread()
                raise_for_reply(reply)
                async for piece in reply.aiter_bytes():
                    yield piece
        except httpx.TransportError as exc:
            raise GatewayUnreachable(self.base_url, str(exc) or type(exc).__name__) from None


def _idempotency() -> dict[str, str]:
    """A key for one call that starts a request: each of its retries gets what the first attempt started."""
    return {retries.IDEMPOTENCY_HEADER: uuid.uuid4().hex}


def _counted(pieces: Iterator[bytes], state: SpeechStream) -> Iterator[bytes]:
    for piece in pieces:
        state.bytes_received += len(piece)
        yield piece


def _sse_data(lines: Iterator[str]) -> Iterator[dict]:
    for line in lines:
        if line.startswith("data: "):
            yield json.loads(line.removeprefix("data: "))

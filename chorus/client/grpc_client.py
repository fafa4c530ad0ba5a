"""gRPC client for `chorus.v1.Chorus`: `GrpcClient` (blocking) and `AsyncGrpcClient`.

Target from the argument, `CHORUS_GRPC` or `127.0.0.1:50050`; the API key travels as `authorization` metadata.
`speak` returns audio only for a request that ended done: a request that failed or was cancelled after its audio
began raises, never returns the part it made. A call the gateway refused for now (RESOURCE_EXHAUSTED) or could not
take (UNAVAILABLE: the gateway process or its backends down), or a stream cut midway (the process serving it died),
is tried again `max_retries` times after 0.5 s doubling: `Speak` again with the same idempotency key before the
request id arrived, else `Resume` after the last chunk received, through any process answering at the target.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc

from chorus.client import retries
from chorus.client.errors import APIError, from_rpc_error
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

FORMATS = {
    name: getattr(gateway_pb2, f"AUDIO_FORMAT_{name.upper()}") for name in ("mp3", "opus", "aac", "flac", "wav", "pcm")
}


def _settings(target: str | None, api_key: str | None) -> tuple[str, tuple]:
    target = target or os.environ.get("CHORUS_GRPC", "127.0.0.1:50050")
    key = api_key or os.environ.get("CHORUS_API_KEY")
    return target, ((("authorization", f"Bearer {key}"),) if key else ())


def speak_request(text: str, model: str, voice: str | None, response_format: str, **fields) -> gateway_pb2.SpeakRequest:
    fields = {name: value for name, value in fields.items() if value is not None}
    return gateway_pb2.SpeakRequest(
        model=model, input=text, voice=voice or "", response_format=FORMATS[response_format], **fields
    )


# Codes a call is tried again on: the gateway refused it for now, or could not be reached (or its stream broke).
RETRY_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
DONE_REASONS = (common_pb2.FINISH_REASON_EOS, common_pb2.FINISH_REASON_MAX_LENGTH, common_pb2.FINISH_REASON_COMPLETE)


class _Speech:
    """Where one `speak` got to over all its attempts: the request id, the last chunk's sequence (where a `Resume`
    goes on from), and whether its Final said done."""

    def __init__(self, request: gateway_pb2.SpeakRequest) -> None:
        self.request = request
        self.request.idempotency_key = uuid.uuid4().hex  # a retry before the id arrived gets the same request
        self.request_id = ""
        self.last_sequence: int | None = None
        self.is_done = False

    def next_call(self, stub: gateway_pb2_grpc.ChorusStub, metadata: tuple):
        """This attempt's stream: the request itself until its id arrived, then the rest of its output."""
        if not self.request_id:
            return stub.Speak(self.request, metadata=metadata)
        resume = gateway_pb2.ResumeRequest(request_id=self.request_id)
        if self.last_sequence is not None:
            resume.after_sequence = self.last_sequence
        return stub.Resume(resume, metadata=metadata)

    def take(self, output: gateway_pb2.SpeakOutput) -> bytes:
        """Notes `output`; returns its audio (b"" for the other messages). Raises APIError for a Final that is not
        done."""
        kind = output.WhichOneof("output")
        if kind == "request_id":
            self.request_id = output.request_id
        elif kind == "audio":
            self.last_sequence = output.audio.sequence
            return output.audio.data
        elif kind == "final":
            final = output.final
            if final.reason not in DONE_REASONS:
                reason = common_pb2.FinishReason.Name(final.reason).removeprefix("FINISH_REASON_")
                message = final.error.message or f"the request ended {reason.lower()}"
                raise APIError(final.error.code or reason, message, request_id=self.request_id or None)
            self.is_done = True
        return b""

    def wait_before_next_s(
        self, attempt: int, max_retries: int, error: grpc.RpcError | None, target: str
    ) -> float | None:
        """After attempt `attempt` (0: the first), which ended in `error` (None: without one): None when its Final
        said done, else the seconds to wait before the next; raises when it is not tried again."""
        if self.is_done:
            return None
        if attempt >= max_retries or (error is not None and error.code() not in RETRY_CODES):
            if error is not None:
                raise from_rpc_error(error, target)
            raise APIError("DATA_LOSS", "the stream ended without its Final", request_id=self.request_id or None)
        return retries.delay_s(attempt, error)


class SpeechPieces:
    """A streamed speech call's audio pieces (`for`, or `async for` from the async client) and its request id."""

    def __init__(self, speech: _Speech, pieces: Iterator[bytes] | AsyncIterator[bytes]) -> None:
        self._speech = speech
        self._pieces = pieces

    @property
    def request_id(self) -> str:
        return self._speech.request_id

    def __iter__(self) -> Iterator[bytes]:
        return self._pieces

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces


class GrpcClient:
    def __init__(
        self, target: str | None = None, api_key: str | None = None, max_retries: int = retries.DEFAULT_MAX_RETRIES
    ) -> None:
        self.target, self._metadata = _settings(target, api_key)
        self._channel = grpc.insecure_channel(self.target)
        self._stub = gateway_pb2_grpc.ChorusStub(self._channel)
        self.max_retries = max_retries

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self._channel.close()

    def speak(self, text: str, *, model: str, voice=None, response_format="wav", **fields) -> tuple[str, bytes]:
        """(request id, the whole audio file) of a request that ended done; fields: language, seed, max_frames, …"""
        stream = self.stream_speak(text, model=model, voice=voice, response_format=response_format, **fields)
        audio = b"".join(stream)
        return stream.request_id, audio

    def stream_speak(self, text: str, *, model: str, voice=None, response_format="pcm", **fields) -> SpeechPieces:
        """The audio in pieces as they are made (iterate it; its `request_id` is known from the first piece on); a
        stream cut midway goes on after the last piece received."""
        speech = _Speech(speak_request(text, model, voice, response_format, **fields))
        return SpeechPieces(speech, self._pieces(speech))

    def _pieces(self, speech: _Speech) -> Iterator[bytes]:
        for attempt in itertools.count():
            error = None
            try:
                for output in speech.next_call(self._stub, self._metadata):
                    if piece := speech.take(output):
                        yield piece
            except grpc.RpcError as rpc_error:
                error = rpc_error
            if (wait_s := speech.wait_before_next_s(attempt, self.max_retries, error, self.target)) is None:
                return
            time.sleep(wait_s)

    def _unary(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.target) from None

    def voices(self) -> list[str]:
        """The names of the built-in speakers and of your saved voices (the first page)."""
        return [voice.name for voice in self.list_voices().voices]

    def list_voices(self, after: str = "", limit: int = 0) -> gateway_pb2.VoiceList:
        return self._unary("ListVoices", gateway_pb2.VoiceListRequest(after=after, limit=limit))

    def create_voice(self, name: str, audio: bytes = b"", **fields) -> gateway_pb2.Voice:
        """Saves a voice from `audio` (an audio file's bytes; fields: ref_text, language, x_vector_only) or from
        `instructions` alone; use it as `voice=name`."""
        return self._unary("CreateVoice", gateway_pb2.CreateVoiceRequest(name=name, audio=audio, **fields))

    def voice(self, voice: str) -> gateway_pb2.Voice:
        return self._unary("GetVoice", gateway_pb2.VoiceRef(voice=voice))

    def delete_voice(self, voice: str) -> gateway_pb2.Voice:
        return self._unary("DeleteVoice", gateway_pb2.VoiceRef(voice=voice))


class AsyncGrpcClient:
    """The same verbs as `GrpcClient`, awaitable."""

    def __init__(
        self, target: str | None = None, api_key: str | None = None, max_retries: int = retries.DEFAULT_MAX_RETRIES
    ) -> None:
        self.target, self._metadata = _settings(target, api_key)
        self._channel = grpc.aio.insecure_channel(self.target)
        self._stub = gateway_pb2_grpc.ChorusStub(self._channel)
        self.max_retries = max_retries

    async def __aenter__(self) -> AsyncGrpcClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._channel.close()

    async def speak(self, text: str, *, model: str, voice=None, response_format="wav", **fields) -> tuple[str, bytes]:
        stream = self.stream_speak(text, model=model, voice=voice, response_format=response_format, **fields)
        audio = b"".join([piece async for piece in stream])
        return stream.request_id, audio

    def stream_speak(self, text: str, *, model: str, voice=None, response_format="pcm", **fields) -> SpeechPieces:
        """As `GrpcClient.stream_speak`, with `async for`."""
        speech = _Speech(speak_request(text, model, voice, response_format, **fields))
        return SpeechPieces(speech, self._pieces(speech))

    async def _pieces(self, speech: _Speech) -> AsyncIterator[bytes]:
        for attempt in itertools.count():
            error = None
            try:
                async for output in speech.next_call(self._stub, self._metadata):
                    if piece := speech.take(output):
                        yield piece
            except grpc.RpcError as rpc_error:
                error = rpc_error
            if (wait_s := speech.wait_before_next_s(attempt, self.max_retries, error, self.target)) is None:
                return
            await asyncio.sleep(wait_s)

    async def _unary(self, method: str, request):
        try:
            return await getattr(self._stub, method)(request, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.target) from None

    async def voices(self) -> list[str]:
        return [voice.name for voice in (await self.list_voices()).voices]

    async def list_voices(self, after: str = "", limit: int = 0) -> gateway_pb2.VoiceList:
        return await self._unary("ListVoices", gateway_pb2.VoiceListRequest(after=after, limit=limit))

    async def create_voice(self, name: str, audio: bytes = b"", **fields) -> gateway_pb2.Voice:
        return await self._unary("CreateVoice", gateway_pb2.CreateVoiceRequest(name=name, audio=audio, **fields))

    async def voice(self, voice: str) -> gateway_pb2.Voice:
        return await self._unary("GetVoice", gateway_pb2.VoiceRef(voice=voice))

    async def delete_voice(self, voice: str) -> gateway_pb2.Voice:
        return await self._unary("DeleteVoice", gateway_pb2.VoiceRef(voice=voice))

"""gRPC client for `chorus.v1.Chorus`: `GrpcClient` (blocking) and `AsyncGrpcClient`.

Target from the argument, `CHORUS_GRPC` or `127.0.0.1:50050`; the API key travels as `authorization` metadata.
"""

from __future__ import annotations

import os

import grpc

from chorus.client.errors import from_rpc_error
from chorus.v1 import gateway_pb2, gateway_pb2_grpc

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


class GrpcClient:
    def __init__(self, target: str | None = None, api_key: str | None = None) -> None:
        self.target, self._metadata = _settings(target, api_key)
        self._channel = grpc.insecure_channel(self.target)
        self._stub = gateway_pb2_grpc.ChorusStub(self._channel)

    def __enter__(self) -> GrpcClient:
        return self

    def __exit__(self, *exc) -> None:
        self._channel.close()

    def speak(self, text: str, *, model: str, voice=None, response_format="wav", **fields) -> tuple[str, bytes]:
        """(request id, the whole audio file); fields: language, seed, max_frames, …"""
        request = speak_request(text, model, voice, response_format, **fields)
        request_id, audio = "", b""
        try:
            for output in self._stub.Speak(request, metadata=self._metadata):
                if output.WhichOneof("output") == "request_id":
                    request_id = output.request_id
                elif output.HasField("audio"):
                    audio += output.audio.data
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.target) from None
        return request_id, audio

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

    def __init__(self, target: str | None = None, api_key: str | None = None) -> None:
        self.target, self._metadata = _settings(target, api_key)
        self._channel = grpc.aio.insecure_channel(self.target)
        self._stub = gateway_pb2_grpc.ChorusStub(self._channel)

    async def __aenter__(self) -> AsyncGrpcClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._channel.close()

    async def speak(self, text: str, *, model: str, voice=None, response_format="wav", **fields) -> tuple[str, bytes]:
        request = speak_request(text, model, voice, response_format, **fields)
        request_id, audio = "", b""
        try:
            async for output in self._stub.Speak(request, metadata=self._metadata):
                if output.WhichOneof("output") == "request_id":
                    request_id = output.request_id
                elif output.HasField("audio"):
                    audio += output.audio.data
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.target) from None
        return request_id, audio

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

"""gRPC client for `chorus.v1.Chorus`: `GrpcClient` (blocking) and `AsyncGrpcClient`.

Target from the argument, `CHORUS_GRPC` or `127.0.0.1:50050`; the API key travels as `authorization` metadata.
"""

from __future__ import annotations

import os

import grpc

from chorus.client.errors import from_rpc_error
from chorus.v1 import gateway_pb2, gateway_pb2_grpc, talker_pb2

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

    def voices(self) -> list[str]:
        try:
            reply = self._stub.ListVoices(talker_pb2.ListVoicesRequest(), metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.target) from None
        return [voice.name for voice in reply.voices]


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

    async def voices(self) -> list[str]:
        try:
            reply = await self._stub.ListVoices(talker_pb2.ListVoicesRequest(), metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, self.target) from None
        return [voice.name for voice in reply.voices]

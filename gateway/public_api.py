"""The public gRPC API (`chorus.v1.Chorus`): same auth, validation and status codes as REST.

Auth travels as `authorization: Bearer <key>` metadata. Request status, cancel and resume work
from Redis state on any gateway replica. Speak, SpeakStream, Generate and ListVoices validate
their input (INVALID_ARGUMENT naming the field), need healthy backends (UNAVAILABLE), and then
answer UNIMPLEMENTED until the orchestration is wired to the engines.
"""

from __future__ import annotations

import grpc

from chorus.gateway import proto_convert
from chorus.gateway.context import GatewayContext
from chorus.gateway.errors import InvalidParam
from chorus.gateway.ref_audio import check_is_audio
from chorus.gateway.streaming import as_speak_outputs
from chorus.runtime.errors import NotImplementedYet
from chorus.v1 import gateway_pb2, gateway_pb2_grpc

_NOT_YET = "not available yet: the gateway's orchestration is not wired to the engines"


class ChorusServicer(gateway_pb2_grpc.ChorusServicer):
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def _authorize(self, context: grpc.aio.ServicerContext) -> str:
        metadata = dict(context.invocation_metadata() or ())
        return await self.ctx.authorize(metadata.get("authorization"))

    async def _check_speak_request(self, request: gateway_pb2.SpeakRequest, is_text_streamed: bool) -> None:
        speech = proto_convert.speech_request(request)
        if is_text_streamed:
            # Text arrives later as deltas; only the length limit applies to what is here already.
            if len(speech.input) > self.ctx.config.max_input_chars:
                raise InvalidParam("input", f"is longer than {self.ctx.config.max_input_chars} characters")
        else:
            speech.check_limits(self.ctx.config.max_input_chars)
        if request.ref_audio:
            if len(request.ref_audio) > self.ctx.config.max_ref_audio_bytes:
                raise InvalidParam("ref_audio", f"is larger than {self.ctx.config.max_ref_audio_bytes} bytes")
            check_is_audio(request.ref_audio)
        self.ctx.require_backends("talker", "vocoder")

    async def Speak(self, request, context):
        await self._authorize(context)
        await self._check_speak_request(request, is_text_streamed=False)
        raise NotImplementedYet(f"Speak is {_NOT_YET}")
        yield  # pragma: no cover - makes this an async generator, as the contract streams

    async def SpeakStream(self, request_iterator, context):
        await self._authorize(context)
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("input") != "request":
            raise InvalidParam("request", "the first SpeakInput must carry a SpeakRequest")
        await self._check_speak_request(first.request, is_text_streamed=True)
        raise NotImplementedYet(f"SpeakStream is {_NOT_YET}")
        yield  # pragma: no cover

    async def Resume(self, request, context):
        owner = await self._authorize(context)
        record = await self.ctx.owned_record(request.request_id, owner)
        after_sequence = request.after_sequence if request.HasField("after_sequence") else None
        entries = self.ctx.journal.read(record.request_id, after_sequence)
        async for output in as_speak_outputs(record.request_id, record.kind, entries):
            yield output

    async def Generate(self, request, context):
        await self._authorize(context)
        proto_convert.generation_request(request).check_limits(self.ctx.config.max_input_chars)
        self.ctx.require_backends("diffusion")
        raise NotImplementedYet(f"Generate is {_NOT_YET}")
        yield  # pragma: no cover

    async def GetRequest(self, request, context):
        owner = await self._authorize(context)
        return proto_convert.request_status(await self.ctx.owned_record(request.request_id, owner))

    async def Cancel(self, request, context):
        owner = await self._authorize(context)
        await self.ctx.owned_record(request.request_id, owner)
        await self.ctx.requests.request_cancel(request.request_id)
        return proto_convert.request_status(await self.ctx.requests.get(request.request_id))

    async def ListVoices(self, request, context):
        await self._authorize(context)
        self.ctx.require_backends("talker")
        raise NotImplementedYet(f"ListVoices is {_NOT_YET}")

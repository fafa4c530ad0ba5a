"""The public gRPC API (`chorus.v1.Chorus`): same auth, validation and status codes as REST.

Auth travels as `authorization: Bearer <key>` metadata. Request status, cancel and resume work
from Redis state on any gateway replica, and so do saved voices (each the caller's own). Speak
and SpeakStream run on the talker and vocoder (SpeakStream forwards text deltas to the talker's
stream as they arrive), Generate on the diffusion service; invalid input is INVALID_ARGUMENT
naming the field, missing backends UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from chorus.gateway import proto_convert
from chorus.gateway.context import GatewayContext
from chorus.gateway.errors import InvalidParam
from chorus.gateway.jobs import follow_record, start_generation, start_speech
from chorus.gateway.ref_audio import check_is_audio
from chorus.gateway.schemas import SpeechRequest
from chorus.gateway.streaming import as_speak_outputs, final_message
from chorus.gateway.voices import MAX_PAGE_SIZE
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc


async def _text_deltas(messages: AsyncIterator, num_chars: int, max_chars: int) -> AsyncIterator[str]:
    """The text deltas after the SpeakRequest, until `end_of_input` (or the client half-closes)."""
    async for message in messages:
        kind = message.WhichOneof("input")
        if kind == "end_of_input":
            return
        if kind != "text_delta":
            raise InvalidParam("input", f"only text_delta and end_of_input may follow the request, got {kind}")
        num_chars += len(message.text_delta)
        if num_chars > max_chars:
            raise InvalidParam("input", f"the streamed text passed the {max_chars} character limit")
        yield message.text_delta


class ChorusServicer(gateway_pb2_grpc.ChorusServicer):
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def _authorize(self, context: grpc.aio.ServicerContext) -> str:
        metadata = dict(context.invocation_metadata() or ())
        return await self.ctx.authorize(metadata.get("authorization"))

    async def _check_speak_request(self, request: gateway_pb2.SpeakRequest, is_text_streamed: bool) -> SpeechRequest:
        speech = proto_convert.speech_request(request)
        if is_text_streamed:
            # Text arrives later as deltas; only the length limit applies to what is here already.
            if len(speech.input) > self.ctx.config.max_input_chars:
                raise InvalidParam("input", f"is longer than {self.ctx.config.max_input_chars} characters")
        else:
            speech.check_limits(self.ctx.config.max_input_chars)
        if request.ref_audio:
            self._check_audio(request.ref_audio, "ref_audio")
        self.ctx.require_backends("talker", "vocoder")
        return speech

    def _check_audio(self, data: bytes, param: str) -> None:
        if len(data) > self.ctx.config.max_ref_audio_bytes:
            raise InvalidParam(param, f"is larger than {self.ctx.config.max_ref_audio_bytes} bytes")
        check_is_audio(data, param)

    async def Speak(self, request, context):
        owner = await self._authorize(context)
        speech = await self._check_speak_request(request, is_text_streamed=False)
        ref_audio = request.ref_audio or None
        record = await start_speech(self.ctx, speech, owner, request.idempotency_key or None, ref_audio)
        entries = self.ctx.runs.follow(record.request_id)
        async for output in as_speak_outputs(record.request_id, record.kind, entries):
            yield output

    async def SpeakStream(self, request_iterator, context):
        owner = await self._authorize(context)
        messages = aiter(request_iterator)
        first = await anext(messages, None)
        if first is None or first.WhichOneof("input") != "request":
            raise InvalidParam("request", "the first SpeakInput must carry a SpeakRequest")
        speech = await self._check_speak_request(first.request, is_text_streamed=True)
        deltas = _text_deltas(messages, len(speech.input), self.ctx.config.max_input_chars)
        ref_audio = first.request.ref_audio or None
        record = await start_speech(self.ctx, speech, owner, first.request.idempotency_key or None, ref_audio, deltas)
        entries = self.ctx.runs.follow(record.request_id)
        async for output in as_speak_outputs(record.request_id, record.kind, entries):
            yield output

    async def Resume(self, request, context):
        owner = await self._authorize(context)
        record = await self.ctx.owned_record(request.request_id, owner)
        after_sequence = request.after_sequence if request.HasField("after_sequence") else None
        entries = self.ctx.runs.follow(record.request_id, after_sequence)
        async for output in as_speak_outputs(record.request_id, record.kind, entries):
            yield output

    async def Generate(self, request, context):
        owner = await self._authorize(context)
        body = proto_convert.generation_request(request)
        body.check_limits(self.ctx.config.max_input_chars)
        record = await start_generation(self.ctx, body, owner, request.idempotency_key or None, is_detachable=True)
        with self.ctx.runs.reading(record.request_id):
            yield gateway_pb2.TextToAudioOutput(request_id=record.request_id)
            last_progress = None
            async for snapshot in follow_record(self.ctx, record.request_id):
                if snapshot.progress is not None and snapshot.progress != last_progress:
                    last_progress = snapshot.progress
                    yield gateway_pb2.TextToAudioOutput(progress=common_pb2.Progress(**snapshot.progress))
            async for entry in self.ctx.journal.read(record.request_id):
                if entry.final is None:
                    audio = gateway_pb2.AudioData(data=entry.data, sequence=entry.sequence)
                    yield gateway_pb2.TextToAudioOutput(audio=audio)
                else:
                    yield gateway_pb2.TextToAudioOutput(final=final_message(entry.final, "audio"))

    async def GetRequest(self, request, context):
        owner = await self._authorize(context)
        return proto_convert.request_status(await self.ctx.owned_record(request.request_id, owner))

    async def Cancel(self, request, context):
        owner = await self._authorize(context)
        await self.ctx.owned_record(request.request_id, owner)
        await self.ctx.requests.request_cancel(request.request_id)
        return proto_convert.request_status(await self.ctx.requests.get(request.request_id))

    async def ListVoices(self, request, context):
        owner = await self._authorize(context)
        self.ctx.require_backends("talker")
        voices, has_more = await self.ctx.voices.page(owner, request.after or None, request.limit or MAX_PAGE_SIZE)
        talker = await self.ctx.catalog.voices()
        named = [proto_convert.voice(voice) for voice in voices]
        return gateway_pb2.VoiceList(voices=named, languages=talker.languages, has_more=has_more)

    async def CreateVoice(self, request, context):
        owner = await self._authorize(context)
        body = proto_convert.create_voice_request(request)
        if request.audio:
            self._check_audio(request.audio, "audio")
        return proto_convert.voice(await self.ctx.voices.create(owner, body, request.audio or None))

    async def GetVoice(self, request, context):
        owner = await self._authorize(context)
        return proto_convert.voice(await self.ctx.voices.get(owner, request.voice))

    async def DeleteVoice(self, request, context):
        owner = await self._authorize(context)
        return proto_convert.voice(await self.ctx.voices.delete(owner, request.voice))

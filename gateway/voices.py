"""Saved voices: made once from a reference recording (or from instructions), then named in any speech request.

Saving runs the reference through the backends an inline voice-clone request uses, the vocoder's
codec encoder for the codes and the talker's speaker encoder for the x-vector, and keeps what
they return. A request naming the voice then hands the talker exactly what the inline request
would have had computed: the same codes for the same seed.

A voice belongs to the API key that saved it (without keys, to everyone); another key's voice is
"not found", never "forbidden", so neither ids nor names leak. It is made for one talker model,
and another model refuses it.
"""

from __future__ import annotations

import logging
import re
import time

import grpc
import numpy as np

from chorus.gateway.backends import BackendPool
from chorus.gateway.catalog import TalkerCatalog
from chorus.gateway.config import GatewayConfig
from chorus.gateway.errors import AlreadyExists, InvalidParam
from chorus.gateway.schemas import MAX_VOICE_NAME_CHARS, CreateVoiceRequest, SpeechRequest
from chorus.gateway.speech_pipeline import upstream_error
from chorus.gateway.state.voices import ID_PREFIX, Voice, VoiceStore, fold_name, new_voice_id
from chorus.gateway.voice_clone import ReferenceCodes
from chorus.runtime.errors import InvalidRequest, NotFound
from chorus.runtime.logs import REQUEST_ID_HEADER, request_id_var
from chorus.v1 import talker_pb2

log = logging.getLogger("chorus.gateway.voices")

# Letters and digits, then also spaces, '.', '_' and '-': no path separators, no control characters.
_NAME = re.compile(rf"[^\W_][\w .-]{{0,{MAX_VOICE_NAME_CHARS - 1}}}")
_TASK_TYPES = {"clone": "voice_clone", "design": "voice_design"}  # a saved voice's kind → its speech task
_TALKER_TASK_TYPES = {"clone": talker_pb2.TASK_TYPE_VOICE_CLONE, "design": talker_pb2.TASK_TYPE_VOICE_DESIGN}
MAX_PAGE_SIZE = 100


def check_name(name: str) -> None:
    if not _NAME.fullmatch(name) or name != name.rstrip():
        raise InvalidParam(
            "name",
            f"use 1 to {MAX_VOICE_NAME_CHARS} letters, digits, spaces, '.', '_' or '-', starting with a letter or "
            "a digit and not ending with a space",
        )
    if name.startswith(ID_PREFIX):
        raise InvalidParam("name", f"must not start with {ID_PREFIX!r} (voice ids do)")


def speech_in(voice: Voice, body: SpeechRequest) -> SpeechRequest:
    """`body` as the talker is to see it in the saved `voice`: the voice's task and instructions, and its
    language unless the request names one."""
    return body.model_copy(
        update={
            "voice": None,
            "task_type": _TASK_TYPES[voice.kind],
            "instructions": voice.instructions or body.instructions,
            "language": body.language or voice.language or None,
        }
    )


def voice_clone(voice: Voice) -> talker_pb2.VoiceClone | None:
    """What the talker needs of a cloned voice (nothing for a designed one)."""
    if voice.kind != "clone":
        return None
    embedding = np.frombuffer(voice.speaker_embedding, dtype="<f4").tolist()
    clone = talker_pb2.VoiceClone(speaker_embedding=embedding, x_vector_only=voice.x_vector_only)
    if not voice.x_vector_only:
        clone.reference_codes.ParseFromString(voice.reference_codes)
        clone.reference_text = voice.ref_text
    return clone


def _refused_audio(message: str) -> InvalidParam:
    """A backend's refusal of the reference ("vocoder: audio: too long") as the 400 naming `audio`."""
    _, _, reason = message.partition(": audio: ")
    return InvalidParam("audio", reason or message)


class VoiceRegistry:
    def __init__(
        self,
        store: VoiceStore,
        backends: BackendPool,
        catalog: TalkerCatalog,
        reference_codes: ReferenceCodes,
        config: GatewayConfig,
        timeout_s: float = 30.0,
    ) -> None:
        self.store = store
        self.backends = backends
        self.catalog = catalog
        self.reference_codes = reference_codes
        self.max_voices = config.max_voices_per_key
        self.max_reference_s = config.max_voice_reference_s
        self.timeout_s = timeout_s

    async def create(self, owner: str, body: CreateVoiceRequest, audio: bytes | None) -> Voice:
        """Saves a voice cloned from `audio` (an audio file, checked already) or designed from `body.instructions`."""
        body.check_fields()
        check_name(body.name)
        talker = await self.catalog.voices()
        if fold_name(body.name) in {fold_name(speaker) for speaker in talker.speakers}:
            raise AlreadyExists("name", f"{body.name!r} is a built-in speaker of {talker.model}")
        kind = "design" if audio is None else "clone"
        if _TALKER_TASK_TYPES[kind] not in talker.task_types:
            field = "audio" if audio else "instructions"
            raise InvalidParam(field, f"the talker ({talker.model}) makes no {_TASK_TYPES[kind]} voices")
        await self.store.check_room(owner, body.name, self.max_voices)  # before the backends work for nothing
        fields = {"instructions": body.instructions} if audio is None else await self._reference(audio, body)
        voice = Voice(
            voice_id=new_voice_id(),
            name=body.name,
            kind=kind,
            model=talker.model,
            created_at_s=time.time(),
            language=body.language or "",
            **fields,
        )
        await self.store.add(owner, voice, self.max_voices)
        log.info("saved %s voice %s (%r) for model %s", kind, voice.voice_id, voice.name, voice.model)
        return voice

    async def _reference(self, audio: bytes, body: CreateVoiceRequest) -> dict:
        """What a cloned voice keeps of its reference: codes (in-context only, but encoding also measures the
        audio), x-vector, transcript, duration."""
        request_id = request_id_var.get()
        try:
            encoded = await self.reference_codes.encode(audio, request_id)
        except InvalidRequest as exc:
            raise _refused_audio(str(exc)) from None
        if encoded.audio_s > self.max_reference_s:
            raise InvalidParam("audio", f"is {encoded.audio_s:.1f} s long; the limit is {self.max_reference_s:g} s")
        if encoded.codes.num_frames == 0:
            raise InvalidParam("audio", "is too short to clone a voice from")
        # In-context cloning needs the reference's transcript; without one, the speaker embedding is the voice.
        x_vector_only = body.x_vector_only or not body.ref_text
        return {
            "ref_text": body.ref_text or "",
            "x_vector_only": x_vector_only,
            "ref_duration_s": encoded.audio_s,
            "speaker_embedding": await self._speaker_embedding(audio, request_id),
            "reference_codes": b"" if x_vector_only else encoded.codes.SerializeToString(),
        }

    async def _speaker_embedding(self, audio: bytes, request_id: str) -> bytes:
        replica = self.backends.pick("talker")
        try:
            reply = await replica.stub.EmbedSpeaker(
                talker_pb2.EmbedSpeakerRequest(audio=audio),
                timeout=self.timeout_s,
                metadata=((REQUEST_ID_HEADER, request_id),),
            )
        except grpc.aio.AioRpcError as exc:
            error = upstream_error(exc, "talker")
            raise _refused_audio(str(error)) if isinstance(error, InvalidRequest) else error from None
        return np.asarray(reply.speaker_embedding, dtype="<f4").tobytes()

    async def get(self, owner: str, voice: str) -> Voice:
        """The owner's saved voice named `voice` (id or name), else the built-in speaker; NotFound otherwise."""
        saved = await self.store.find(owner, voice)
        if saved is not None:
            return saved
        talker = await self.catalog.voices()
        for speaker in talker.speakers:
            if fold_name(speaker) == fold_name(voice):
                return Voice.builtin(speaker, talker.model)
        raise NotFound(f"voice {voice!r} not found")

    async def delete(self, owner: str, voice: str) -> Voice:
        saved = await self.store.find(owner, voice)
        if saved is None or not await self.store.remove(owner, saved):
            raise NotFound(f"voice {voice!r} not found")
        log.info("deleted voice %s (%r)", saved.voice_id, saved.name)
        return saved

    async def page(self, owner: str, after: str | None, limit: int) -> tuple[list[Voice], bool]:
        """Up to `limit` voices after the one whose id is `after`: the built-in speakers, then the owner's saved
        voices, oldest first; and whether more follow."""
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise InvalidParam("limit", f"must be 1 to {MAX_PAGE_SIZE}, got {limit}")
        talker = await self.catalog.voices()
        builtins = [Voice.builtin(speaker, talker.model) for speaker in talker.speakers]
        builtin_ids = [voice.voice_id for voice in builtins]
        if after is not None and after not in builtin_ids:
            return await self.store.page(owner, after, limit)
        first = 0 if after is None else builtin_ids.index(after) + 1
        listed = builtins[first : first + limit]
        saved, has_more = await self.store.page(owner, None, limit - len(listed))
        return listed + saved, has_more or first + limit < len(builtins)

    async def for_speech(self, owner: str, body: SpeechRequest, talker: talker_pb2.ListVoicesResponse) -> Voice | None:
        """The saved voice `body.voice` names, checked against the request; None for a built-in speaker or none.

        NotFound for an unknown voice, unless the checkpoint has no built-in speakers (then any voice is taken,
        as the OpenAI SDK always sends one)."""
        if body.voice is None or fold_name(body.voice) in {fold_name(speaker) for speaker in talker.speakers}:
            return None
        voice = await self.store.find(owner, body.voice)
        if voice is None:
            if talker.speakers:
                raise NotFound(f"voice {body.voice!r} not found; GET /v1/audio/voices lists the available ones")
            return None
        if voice.model != talker.model:
            raise InvalidParam("voice", f"{body.voice!r} was made for model {voice.model}, not {talker.model}")
        if body.ref_audio is not None or body.speaker_embedding is not None:
            raise InvalidParam("voice", "a saved voice brings its own reference: drop ref_audio and speaker_embedding")
        if body.task_type not in (None, _TASK_TYPES[voice.kind]):
            raise InvalidParam("task_type", f"the voice {body.voice!r} is a {_TASK_TYPES[voice.kind]} voice")
        if voice.kind == "design" and body.instructions is not None:
            raise InvalidParam("instructions", f"the voice {body.voice!r} is designed by its own instructions")
        return voice

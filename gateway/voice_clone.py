"""Voice clone inputs: reference audio → codec codes (`Vocoder.Encode`), cached per audio hash.

A client that clones one voice for many requests sends the same reference audio each time; its
codes are computed once per gateway replica (bounded LRU) instead of on every request. The
talker computes the speaker embedding itself from the reference audio carried in the request,
likewise once per distinct audio (`chorus.talker.speaker_cache`).
"""

from __future__ import annotations

import collections
import hashlib

import grpc

from chorus.gateway.backends import BackendPool
from chorus.gateway.speech_pipeline import upstream_error
from chorus.v1 import common_pb2, talker_pb2, vocoder_pb2


class ReferenceCodes:
    def __init__(self, backends: BackendPool, max_entries: int = 256, timeout_s: float = 30.0) -> None:
        self.backends = backends
        self.max_entries = max_entries
        self.timeout_s = timeout_s
        self._codes: collections.OrderedDict[str, common_pb2.CodecChunk] = collections.OrderedDict()

    async def codes(self, audio: bytes, request_id: str) -> common_pb2.CodecChunk:
        """The codec codes of `audio` (an audio file), from the cache or a vocoder replica."""
        digest = hashlib.sha256(audio).hexdigest()
        if digest in self._codes:
            self._codes.move_to_end(digest)
            return self._codes[digest]
        replica = self.backends.pick("vocoder")
        try:
            reply = await replica.stub.Encode(
                vocoder_pb2.EncodeRequest(request_id=request_id, audio=audio), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise upstream_error(exc, "vocoder") from None
        self._codes[digest] = reply.codes
        if len(self._codes) > self.max_entries:
            self._codes.popitem(last=False)
        return reply.codes

    async def voice_clone(
        self, audio: bytes, reference_text: str | None, x_vector_only: bool, request_id: str
    ) -> talker_pb2.VoiceClone:
        """The talker's VoiceClone for a reference: the audio itself, plus codes and text for ICL."""
        clone = talker_pb2.VoiceClone(reference_audio=audio, x_vector_only=x_vector_only)
        if not x_vector_only:
            clone.reference_codes.CopyFrom(await self.codes(audio, request_id))
            clone.reference_text = reference_text or ""
        return clone

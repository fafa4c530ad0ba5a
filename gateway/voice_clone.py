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
import numpy as np

from chorus.gateway.backends import BackendPool
from chorus.gateway.speech_pipeline import upstream_error
from chorus.v1 import common_pb2, talker_pb2, vocoder_pb2


class ReferenceCodes:
    def __init__(self, backends: BackendPool, max_entries: int = 256, timeout_s: float = 30.0) -> None:
        self.backends = backends
        self.max_entries = max_entries
        self.timeout_s = timeout_s
        self._encoded: collections.OrderedDict[str, vocoder_pb2.EncodeResponse] = collections.OrderedDict()

    async def encode(self, audio: bytes, request_id: str) -> vocoder_pb2.EncodeResponse:
        """The codec codes and duration of `audio` (an audio file), from the cache or a vocoder replica."""
        digest = hashlib.sha256(audio).hexdigest()
        if digest in self._encoded:
            self._encoded.move_to_end(digest)
            return self._encoded[digest]
        replica = self.backends.pick("vocoder")
        try:
            reply = await replica.stub.Encode(
                vocoder_pb2.EncodeRequest(request_id=request_id, audio=audio), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise upstream_error(exc, "vocoder") from None
        self._encoded[digest] = reply
        if len(self._encoded) > self.max_entries:
            self._encoded.popitem(last=False)
        return reply

    async def codes(self, audio: bytes, request_id: str) -> common_pb2.CodecChunk:
        return (await self.encode(audio, request_id)).codes

    async def voice_clone(
        self,
        audio: bytes | None,
        reference_text: str | None,
        x_vector_only: bool,
        request_id: str,
        speaker_embedding: bytes | None = None,
    ) -> talker_pb2.VoiceClone:
        """The talker's VoiceClone for a reference: the audio itself (or the precomputed float32 `speaker_embedding`,
        which the talker then uses instead), plus codes and text for ICL. Without audio, only the embedding."""
        clone = talker_pb2.VoiceClone(x_vector_only=x_vector_only or audio is None)
        if speaker_embedding:
            clone.speaker_embedding.extend(np.frombuffer(speaker_embedding, dtype="<f4").tolist())
        else:
            clone.reference_audio = audio
        if not clone.x_vector_only:
            clone.reference_codes.CopyFrom(await self.codes(audio, request_id))
            clone.reference_text = reference_text or ""
        return clone

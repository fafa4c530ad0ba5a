"""Speaker embeddings (x-vectors) of voice-clone reference audio, cached per reference file.

A client that clones one voice for many requests sends the same reference audio each time; the
speaker encoder runs once per distinct file (keyed by the SHA-256 of its bytes) on this talker
replica, and later requests reuse the exact same vector, so a seeded request gives the same codes.
"""

from __future__ import annotations

import collections
import hashlib

import torch
from prometheus_client import Counter

LOOKUPS = Counter(
    "chorus_talker_speaker_cache_lookups",
    "Voice-clone speaker embedding lookups by reference audio, by outcome (hit: the encoder did not run).",
    ["outcome"],
)


class SpeakerVectorCache:
    """Bounded LRU: reference-audio digest → x-vector `[H]` (as the speaker encoder returned it)."""

    def __init__(self, max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._vectors: collections.OrderedDict[str, torch.Tensor] = collections.OrderedDict()

    @staticmethod
    def key(reference_audio: bytes) -> str:
        return hashlib.sha256(reference_audio).hexdigest()

    def get(self, key: str) -> torch.Tensor | None:
        """The cached vector of `key` (counted as a hit), or None (a miss: the encoder must run)."""
        vector = self._vectors.get(key)
        if vector is None:
            LOOKUPS.labels("miss").inc()
            return None
        self._vectors.move_to_end(key)
        LOOKUPS.labels("hit").inc()
        return vector

    def put(self, key: str, vector: torch.Tensor) -> None:
        self._vectors[key] = vector
        self._vectors.move_to_end(key)
        if len(self._vectors) > self.max_entries:
            self._vectors.popitem(last=False)

"""Saved voices in Redis: a hash per voice and, per owner, an index by creation time and a name → id map.

Voices carry no TTL: they live until deleted, so Redis must persist them (an append-only file) to
outlive a Redis restart. An owner's keys share one hash tag, so saving and deleting are each one
Lua script, atomic on any number of gateway replicas (and on a Redis Cluster): a name is taken
once, and the per-owner count limit holds however many saves race.
"""

from __future__ import annotations

import dataclasses
import uuid

import redis.asyncio as redis

from chorus.gateway.errors import AlreadyExists, InvalidParam, LimitReached
from chorus.gateway.state import keys
from chorus.gateway.state.connection import redis_guard

ID_PREFIX = "voice_"
_BINARY_FIELDS = ("speaker_embedding", "reference_codes")

# KEYS[1] voice, KEYS[2] index, KEYS[3] names. ARGV: id, folded name, created_at_s, max voices, then the voice's
# field/value pairs. Returns 'ok', 'exists' (the owner has a voice of that name) or 'full' (max voices already).
_ADD = """
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then return 'exists' end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 'full' end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
return 'ok'
"""

# KEYS[1] voice, KEYS[2] index, KEYS[3] names. ARGV: id, folded name. Returns 1 if the voice was there. The name
# is freed only while it still names this voice (a concurrent delete and re-save may have reused it).
_REMOVE = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('HGET', KEYS[3], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[3], ARGV[2]) end
return 1
"""

# KEYS[1] index. ARGV: the id to list after ('' from the start), how many. Returns the ids, or false when the
# id to list after is not in the index.
_PAGE = """
local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
  if not rank then return false end
  start = rank + 1
end
return redis.call('ZRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Voice:
    """A voice as listed: a built-in speaker of the talker, or a saved one with what synthesis needs."""

    voice_id: str  # voice_… for a saved voice, the speaker's name for a built-in one
    name: str
    kind: str  # "builtin", "clone" (from reference audio) or "design" (from instructions)
    model: str  # the talker model it belongs to
    created_at_s: float | None = None
    language: str = ""
    instructions: str = ""  # design
    ref_text: str = ""  # clone, in-context: the transcript of the reference
    x_vector_only: bool = False  # clone: the speaker embedding alone, no in-context reference
    ref_duration_s: float = 0.0
    speaker_embedding: bytes = b""  # clone: the x-vector, float32 little-endian
    reference_codes: bytes = b""  # clone, in-context: the reference's codes, a serialized CodecChunk

    @classmethod
    def builtin(cls, speaker: str, model: str) -> Voice:
        return cls(voice_id=speaker, name=speaker, kind="builtin", model=model)

    @property
    def name_key(self) -> str:
        return fold_name(self.name)

    def to_hash(self) -> dict[str, str | bytes]:
        fields = dataclasses.asdict(self)
        fields["x_vector_only"] = int(self.x_vector_only)
        return {name: value if isinstance(value, bytes) else str(value) for name, value in fields.items()}

    @classmethod
    def from_hash(cls, fields: dict[bytes, bytes]) -> Voice:
        raw = {name.decode(): value for name, value in fields.items()}
        text = {name: value.decode() for name, value in raw.items() if name not in _BINARY_FIELDS}
        return cls(
            voice_id=text["voice_id"],
            name=text["name"],
            kind=text["kind"],
            model=text["model"],
            created_at_s=float(text["created_at_s"]),
            language=text.get("language", ""),
            instructions=text.get("instructions", ""),
            ref_text=text.get("ref_text", ""),
            x_vector_only=text.get("x_vector_only") == "1",
            ref_duration_s=float(text.get("ref_duration_s", 0.0)),
            speaker_embedding=raw.get("speaker_embedding", b""),
            reference_codes=raw.get("reference_codes", b""),
        )


def fold_name(name: str) -> str:
    """Names are unique per owner regardless of case: "Alice" and "alice" are one voice."""
    return name.casefold()


def new_voice_id() -> str:
    return ID_PREFIX + uuid.uuid4().hex[:24]


class VoiceStore:
    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._add = client.register_script(_ADD)
        self._remove = client.register_script(_REMOVE)
        self._page = client.register_script(_PAGE)

    @staticmethod
    def _keys(owner: str, voice_id: str) -> list[str]:
        return [keys.voice(owner, voice_id), keys.voice_index(owner), keys.voice_names(owner)]

    async def check_room(self, owner: str, name: str, max_voices: int) -> None:
        """Raises what `add` would for `name` now, before the reference is encoded; `add` checks again, atomically."""
        with redis_guard("reading voices"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hexists(keys.voice_names(owner), fold_name(name))
                pipe.zcard(keys.voice_index(owner))
                is_taken, num_voices = await pipe.execute()
        _raise_for(b"exists" if is_taken else b"full" if num_voices >= max_voices else b"ok", name, max_voices)

    async def add(self, owner: str, voice: Voice, max_voices: int) -> None:
        """Saves `voice`; AlreadyExists when its name is taken, LimitReached when the owner has `max_voices`."""
        args = [voice.voice_id, voice.name_key, voice.created_at_s, max_voices]
        for field, value in voice.to_hash().items():
            args += [field, value]
        with redis_guard("saving a voice"):
            outcome = await self._add(keys=self._keys(owner, voice.voice_id), args=args)
        _raise_for(outcome, voice.name, max_voices)

    async def find(self, owner: str, voice: str) -> Voice | None:
        """The owner's voice whose id or name (any case) is `voice`, or None."""
        with redis_guard("reading a voice"):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(keys.voice(owner, voice))
                pipe.hget(keys.voice_names(owner), fold_name(voice))
                fields, named_id = await pipe.execute()
            if not fields and named_id is not None:
                fields = await self.client.hgetall(keys.voice(owner, named_id.decode()))
        return Voice.from_hash(fields) if fields else None

    async def page(self, owner: str, after: str | None, limit: int) -> tuple[list[Voice], bool]:
        """Up to `limit` of the owner's voices, oldest first, after the voice `after`; and whether more follow."""
        with redis_guard("listing voices"):
            ids = await self._page(keys=[keys.voice_index(owner)], args=[after or "", limit + 1])
            if ids is None:
                raise InvalidParam("after", f"{after!r} is not one of your voices")
            async with self.client.pipeline(transaction=False) as pipe:
                for voice_id in ids[:limit]:
                    pipe.hgetall(keys.voice(owner, voice_id.decode()))
                found = await pipe.execute()
        # A voice deleted since the index was read is left out.
        return [Voice.from_hash(fields) for fields in found if fields], len(ids) > limit

    async def remove(self, owner: str, voice: Voice) -> bool:
        """Deletes `voice`; False when it was already gone."""
        with redis_guard("deleting a voice"):
            removed = await self._remove(keys=self._keys(owner, voice.voice_id), args=[voice.voice_id, voice.name_key])
        return bool(removed)


def _raise_for(outcome: bytes, name: str, max_voices: int) -> None:
    if outcome == b"exists":
        raise AlreadyExists("name", f"you already have a voice named {name!r}")
    if outcome == b"full":
        raise LimitReached(f"you have {max_voices} saved voices, the limit; delete one to save another")

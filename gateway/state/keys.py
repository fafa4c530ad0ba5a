"""Redis key names. Keys of one request (or of one owner's voices) share a hash tag, so a Redis Cluster keeps
them in one slot and one Lua script may touch them all."""

from __future__ import annotations

PREFIX = "chorus"


def record(request_id: str) -> str:
    return f"{PREFIX}:{{req:{request_id}}}:record"


def journal(request_id: str) -> str:
    return f"{PREFIX}:{{req:{request_id}}}:journal"


def frames(request_id: str) -> str:
    """The codec frames a speech run's talker made, per segment: what a takeover continues from."""
    return f"{PREFIX}:{{req:{request_id}}}:frames"


RUNS = f"{PREFIX}:runs"  # the default stream of runs in progress (consumer group: every gateway process)


def cancel_channel(request_id: str) -> str:
    return f"{PREFIX}:{{req:{request_id}}}:cancel"


def cancel_channel_pattern() -> str:
    """A PSUBSCRIBE pattern matching every request's cancel channel."""
    return cancel_channel("*")


def request_id_of_cancel_channel(channel: str) -> str:
    return channel.removeprefix(f"{PREFIX}:{{req:").removesuffix("}:cancel")


def idempotency(owner: str, key: str) -> str:
    return f"{PREFIX}:idem:{owner}:{key}"


def rate_bucket(key_id: str) -> str:
    return f"{PREFIX}:rate:{key_id}"


def _voices(owner: str) -> str:
    """The prefix of one owner's voice keys; "" (no API keys configured) is the one shared namespace."""
    return f"{PREFIX}:{{voices:{owner or 'shared'}}}"


def voice(owner: str, voice_id: str) -> str:
    return f"{_voices(owner)}:voice:{voice_id}"


def voice_index(owner: str) -> str:
    """Sorted set of the owner's voice ids, scored by creation time (list order and pagination)."""
    return f"{_voices(owner)}:index"


def voice_names(owner: str) -> str:
    """Hash of the owner's voice names (case-folded) → voice id: names are unique per owner."""
    return f"{_voices(owner)}:names"

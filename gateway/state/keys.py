"""Redis key names. Keys of one request share a hash tag so a Redis Cluster keeps them in one slot."""

from __future__ import annotations

PREFIX = "chorus"


def record(request_id: str) -> str:
    return f"{PREFIX}:{{req:{request_id}}}:record"


def journal(request_id: str) -> str:
    return f"{PREFIX}:{{req:{request_id}}}:journal"


def frames(request_id: str) -> str:
    """The codec frames a speech run's talker made, per segment: what a takeover continues from."""
    return f"{PREFIX}:{{req:{request_id}}}:frames"


def runs() -> str:
    """The stream of runs in progress (consumer group: every gateway process)."""
    return f"{PREFIX}:runs"


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

"""Waiting for a cancel that may come from any gateway replica.

The flag in the request record is authoritative; the pub/sub message only wakes the waiter
early (pub/sub is at-most-once), so the flag is polled as well.
"""

from __future__ import annotations

import contextlib

from chorus.gateway.state import keys
from chorus.gateway.state.connection import REDIS_ERRORS, redis_guard
from chorus.gateway.state.requests import RequestStore


async def wait_for_cancel(requests: RequestStore, request_id: str, poll_interval_s: float = 0.5) -> None:
    """Returns once a cancel of `request_id` was requested; raises `Unavailable` if Redis fails."""
    pubsub = requests.client.pubsub()
    try:
        with redis_guard("waiting for a cancel"):
            await pubsub.subscribe(keys.cancel_channel(request_id))
        # Subscribed first, then checked: a cancel published in between is still seen via the flag.
        while not await requests.is_cancel_requested(request_id):
            with redis_guard("waiting for a cancel"):
                await pubsub.get_message(ignore_subscribe_messages=True, timeout=poll_interval_s)
    finally:
        with contextlib.suppress(*REDIS_ERRORS):
            await pubsub.aclose()

"""Waiting for a cancel that may come from any gateway replica, on one subscription per process.

The flag in the request record is authoritative; the pub/sub message only wakes a waiter early.
One pattern subscription serves every run of the process and wakes the waiters of the request
named by the channel, which then read the flag. Pub/sub is at-most-once (a message published
while the subscription is down is lost), so every waiter also reads the flag each
`poll_interval_s`, and all of them read it when the subscription is (re)established.

A run watches from before it is marked running: a cancel of a queued request takes effect
there and then (the run never starts), so a cancel that matters is published after the watch
began and reaches it, with no flag read at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

from chorus.gateway.state import keys
from chorus.gateway.state.connection import REDIS_ERRORS
from chorus.gateway.state.requests import RequestStore
from chorus.runtime.tasks import cancel_and_wait, exit_if_it_fails

log = logging.getLogger("chorus.gateway.cancel")


class CancelWatch:
    """One request's watch: `wait` returns once a cancel of it was requested."""

    def __init__(self, requests: RequestStore, request_id: str, poll_interval_s: float) -> None:
        self.requests = requests
        self.request_id = request_id
        self.poll_interval_s = poll_interval_s
        self.woken = asyncio.Event()

    async def wait(self) -> None:
        """Returns once the cancel flag is set; raises `Unavailable` if Redis fails reading it."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), self.poll_interval_s)
            self.woken.clear()
            if await self.requests.is_cancel_requested(self.request_id):
                return


class CancelListener:
    def __init__(self, requests: RequestStore, poll_interval_s: float = 5.0, retry_interval_s: float = 0.5) -> None:
        self.requests = requests
        self.poll_interval_s = poll_interval_s
        self.retry_interval_s = retry_interval_s
        self._watches: dict[str, set[CancelWatch]] = {}
        self._listening: asyncio.Task | None = None

    @contextlib.contextmanager
    def watch(self, request_id: str) -> Iterator[CancelWatch]:
        """Watches `request_id` for the duration of the block."""
        if self._listening is None:
            self._listening = exit_if_it_fails(
                asyncio.create_task(self._listen(), name="cancel-listener"), "cancel listener"
            )
        watch = CancelWatch(self.requests, request_id, self.poll_interval_s)
        self._watches.setdefault(request_id, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches[request_id]
            watches.discard(watch)
            if not watches:
                del self._watches[request_id]

    async def _listen(self) -> None:
        lost_at_s: float | None = None  # while the subscription is down: since when (one warning per outage)
        while True:
            pubsub = self.requests.client.pubsub()
            try:
                await pubsub.psubscribe(keys.cancel_channel_pattern())
                if lost_at_s is not None:
                    log.info("cancel subscription restored after %.1f s", time.monotonic() - lost_at_s)
                    lost_at_s = None
                self._wake_all()  # a cancel published while not subscribed would be lost: read the flags
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        self._wake(keys.request_id_of_cancel_channel(message["channel"].decode()))
            except REDIS_ERRORS as exc:
                if lost_at_s is None:
                    lost_at_s = time.monotonic()
                    log.warning("cancel subscription lost (%s); resubscribing every %.1f s", exc, self.retry_interval_s)
                await asyncio.sleep(self.retry_interval_s)
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()

    def _wake(self, request_id: str) -> None:
        for watch in self._watches.get(request_id, ()):
            watch.woken.set()

    def _wake_all(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.woken.set()

    async def close(self) -> None:
        if self._listening is not None:
            await cancel_and_wait([self._listening], "cancel listener")  # its Redis commands can lose a cancel
            self._listening = None

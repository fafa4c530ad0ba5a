"""What the loaded talker offers (model, speakers, task types, languages), cached per gateway replica.

The talker's `ListVoices` answer changes only when a replica loads another checkpoint, so it is
kept for `ttl_s` instead of being asked on every speech request that names a voice.
"""

from __future__ import annotations

import time

import grpc

from chorus.gateway.backends import BackendPool
from chorus.gateway.speech_pipeline import upstream_error
from chorus.v1 import talker_pb2


class TalkerCatalog:
    def __init__(self, backends: BackendPool, ttl_s: float = 30.0, timeout_s: float = 5.0) -> None:
        self.backends = backends
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._voices: talker_pb2.ListVoicesResponse | None = None
        self._fetched_at_s = 0.0

    async def voices(self) -> talker_pb2.ListVoicesResponse:
        """The talker's ListVoices answer (from the least-loaded healthy replica, then cached)."""
        if self._voices is None or time.monotonic() - self._fetched_at_s > self.ttl_s:
            replica = self.backends.pick("talker")
            try:
                self._voices = await replica.stub.ListVoices(talker_pb2.ListVoicesRequest(), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                raise upstream_error(exc, "talker") from None
            self._fetched_at_s = time.monotonic()
        return self._voices

"""Everything a gateway handler needs, built once per process from the config."""

from __future__ import annotations

import dataclasses

import redis.asyncio as redis

from chorus.gateway.admission import Admission, BackendAdmission
from chorus.gateway.audio.encoder_threads import EncoderThreads
from chorus.gateway.backends import BackendPool
from chorus.gateway.capacity import UNREPORTED_CAPACITY, DerivedLimits, share_of_capacity
from chorus.gateway.catalog import TalkerCatalog
from chorus.gateway.config import GatewayConfig
from chorus.gateway.host_slots import HostSlots
from chorus.gateway.run_broker import RunBroker
from chorus.gateway.runner import RunRegistry
from chorus.gateway.state.auth import ApiKeys, RateLimiter
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.frames import FrameJournal
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import RequestRecord, RequestStore
from chorus.gateway.state.runs import RunQueue, consumer_name
from chorus.gateway.state.voices import VoiceStore
from chorus.gateway.voice_clone import ReferenceCodes
from chorus.gateway.voices import VoiceRegistry
from chorus.runtime.errors import NotFound, Unavailable


@dataclasses.dataclass
class GatewayContext:
    config: GatewayConfig
    backends: BackendPool
    redis: redis.Redis
    requests: RequestStore
    journal: OutputJournal
    cancels: CancelListener
    api_keys: ApiKeys
    rate_limiter: RateLimiter
    admission: Admission
    runs: RunRegistry
    catalog: TalkerCatalog
    reference_codes: ReferenceCodes
    frame_journal: FrameJournal
    broker: RunBroker
    voices: VoiceRegistry
    encoder_threads: EncoderThreads

    @classmethod
    def from_config(cls, config: GatewayConfig) -> GatewayContext:
        backends = BackendPool(
            {
                "talker": config.talker_targets,
                "vocoder": config.vocoder_targets,
                "diffusion": config.diffusion_targets,
            },
            interval_s=config.health_interval_s,
        )
        client = open_redis(config.redis_url)
        requests = RequestStore(client, ttl_s=config.request_ttl_s)
        journal = OutputJournal(client, requests, max_entries=config.journal_max_entries)
        limits = {
            "talker": config.talker_max_in_flight,
            "vocoder": config.vocoder_max_in_flight,
            "diffusion": config.diffusion_max_in_flight,
        }
        runs = RunRegistry(journal, detach_grace_s=config.reconnect_grace_s)
        initial_limit = share_of_capacity(UNREPORTED_CAPACITY, config.admission_split)
        host = HostSlots.from_environ()  # a worker of `--workers N`: limits shared with the others
        admission = Admission(
            {
                kind: BackendAdmission(kind, limit or initial_limit, config.max_queued, config.queue_timeout_s, host)
                for kind, limit in limits.items()
            }
        )
        derived = {kind: admission.backends[kind] for kind, limit in limits.items() if limit == 0}
        backends.on_checked = DerivedLimits(backends, derived, config.admission_split).update
        catalog = TalkerCatalog(backends)
        reference_codes = ReferenceCodes(backends)
        return cls(
            config=config,
            backends=backends,
            redis=client,
            requests=requests,
            journal=journal,
            cancels=CancelListener(requests),
            api_keys=ApiKeys(config.api_keys),
            rate_limiter=RateLimiter(client, config.rate_limit_per_s, config.rate_limit_burst),
            admission=admission,
            runs=runs,
            catalog=catalog,
            reference_codes=reference_codes,
            frame_journal=FrameJournal(client, ttl_s=config.request_ttl_s),
            broker=RunBroker(RunQueue(client, consumer_name(), config.run_lease_s, config.run_queue), runs),
            voices=VoiceRegistry(VoiceStore(client), backends, catalog, reference_codes, config),
            encoder_threads=EncoderThreads(config.encoder_thread_count),
        )

    def require_backends(self, *kinds: str) -> None:
        """Raises `Unavailable` (503) unless every backend in `kinds` has a healthy replica."""
        down = [kind for kind in kinds if not any(r.is_healthy for r in self.backends.replicas[kind])]
        if down:
            raise Unavailable(f"no healthy {' or '.join(down)} replica; retry later")

    async def authorize(self, authorization: str | None) -> str:
        """The key id ("" without auth) for an `Authorization: Bearer <key>` value, rate limit taken.

        Raises Unauthorized for a missing or unknown key, Overloaded when the key's bucket is empty.
        """
        scheme, _, api_key = (authorization or "").partition(" ")
        key_id = self.api_keys.authenticate(api_key.strip() if scheme.lower() == "bearer" else None)
        await self.rate_limiter.take(key_id or "anonymous")
        return key_id

    async def owned_record(self, request_id: str, owner: str) -> RequestRecord:
        """The record, if `owner` may see it (anyone may when auth is off); NotFound otherwise."""
        record = await self.requests.get(request_id)
        if self.api_keys.is_enabled and record.owner != owner:
            raise NotFound(f"request {request_id!r} not found (unknown or expired)")
        return record

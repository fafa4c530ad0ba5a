"""Gateway settings (flags `chorus serve gateway --help`, env vars CHORUS_GATEWAY_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.gateway.audio.encoder_threads import default_encoder_threads
from chorus.gateway.failover import FailoverPolicy
from chorus.gateway.state.redis_url import check_redis_url
from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_GATEWAY_"

    rest_host: str = option("127.0.0.1", "Address the REST API binds to (0.0.0.0 in containers).")
    rest_port: int = option(8000, "REST API port; 0 picks a free one.")
    rest_keep_alive_s: float = option(
        75.0,
        "Seconds an idle REST connection stays open. Longer than clients keep idle connections in their pools "
        "(httpx 5 s, aiohttp 15 s, ingress-nginx's upstream pool 60 s), so the client closes first: a server "
        "closing at the client's idle limit races the client's next request on that connection, which then fails "
        "with 'Server disconnected'.",
    )
    redis_url: str = option(
        "redis://127.0.0.1:6379/0",
        "Redis holding request state (REDIS_URL also works): redis://[[user]:password@]host:port/db, or a Sentinel "
        "deployment as redis+sentinel://[password@]host:port[,host:port…]/master_name[/db] (README, Redis).",
    )
    talker_targets: tuple[str, ...] = option(("127.0.0.1:50051",), "Talker replicas, host:port, comma-separated.")
    vocoder_targets: tuple[str, ...] = option(("127.0.0.1:50052",), "Vocoder replicas, host:port, comma-separated.")
    diffusion_targets: tuple[str, ...] = option(("127.0.0.1:50053",), "Diffusion replicas, host:port, comma-separated.")
    health_interval_s: float = option(1.0, "How often each backend replica's health is checked.")
    workers: int = option(
        1,
        "Gateway processes sharing these ports, one core each, and the admission limits below (they count their "
        "slots together, wherever the kernel sends a connection). 2–4 keep up with one GPU's PCM speech traffic, "
        "which one process cannot; mp3 and opus cost 5–7× pcm's CPU per audio second, and encode best in many "
        "processes of one thread each (on a 16-core H200 host, 16 workers kept 64 mp3 streams at pcm's throughput, "
        "4 at 90 %). `chorus up` starts one per core, at most 16, when its talker runs on CUDA.",
    )

    encoder_threads: int = option(
        0,
        "Threads encoding mp3, opus, aac and flac in each gateway process; 0: this host's cores divided among its "
        "gateway processes (--workers), at least 1 and at most 4.",
    )

    max_input_chars: int = option(4096, "Longest speech `input` (and text-to-audio `prompt`) accepted, in characters.")
    max_body_bytes: int = option(16 * 1024 * 1024, "Largest request body accepted (413 beyond it).")
    max_ref_audio_bytes: int = option(10 * 1024 * 1024, "Largest voice-clone reference audio, decoded.")
    ref_audio_allowed_hosts: tuple[str, ...] = option((), "Hosts `ref_audio` URLs may point to; none by default.")
    max_voices_per_key: int = option(100, "Saved voices one API key may keep (without keys: all callers together).")
    max_voice_reference_s: float = option(30.0, "Longest reference audio a saved voice is made from, in seconds.")
    api_keys: tuple[str, ...] = option((), "API keys (or sha256:<hex> of them), comma-separated; empty = no auth.")
    rate_limit_per_s: float = option(0.0, "Requests per second per API key (token bucket in Redis); 0 = no limit.")
    rate_limit_burst: int = option(20, "Token bucket size: requests a key may send at once.")
    request_ttl_s: int = option(3600, "How long request records and output journals stay in Redis.")
    max_output_lead_s: float = option(
        30.0, "Seconds of audio a speech run may make ahead of what its client read; beyond it, that request pauses."
    )
    reconnect_grace_s: float = option(
        0.4,
        "How long a run keeps going after its last reader disconnected, for a reconnect to resume it live; "
        "then its upstream streams are cancelled (GPU slots freed). Async jobs are not affected.",
    )
    journal_max_entries: int = option(10_000, "Most audio chunks journaled per request (oldest trimmed first).")
    # As many in flight as the backend serves: more would only queue inside it, fewer would leave it idle. The
    # speech backends' capacity depends on their device (the talker's 256 slots on CUDA, 64 elsewhere), so by
    # default the limits follow what their replicas report (chorus.gateway.capacity); diffusion batches 8 samples.
    talker_max_in_flight: int = option(
        0,
        "Speech requests running at once on the talker backend; 0: as many as its healthy replicas report they serve "
        "(256 per replica on CUDA, 64 elsewhere, at their defaults), split between admission_split gateway replicas.",
    )
    vocoder_max_in_flight: int = option(
        0, "Speech requests running at once on the vocoder backend; 0: what its replicas report, as for the talker."
    )
    diffusion_max_in_flight: int = option(
        8, "Text-to-audio requests running at once on the diffusion backend; 0: what its replicas report."
    )
    admission_split: int = option(
        1,
        "Gateway replicas sharing the backends, among which each limit of 0 above is split evenly (each admits its "
        "share, rounded up; the --workers of one replica share its share). Set it to the number of gateway "
        "replicas in front of the same backends, or they admit that many times what the backends serve.",
    )
    max_queued: int = option(
        -1,
        "Requests that may wait for a backend slot, per backend (429 beyond it); -1: as many as the backend's "
        "limit, so that clients keeping at most the limit in flight are never refused for a full queue.",
    )
    queue_timeout_s: float = option(10.0, "Longest wait for a backend slot before 429.")
    speech_segment_chars: int = option(
        300, "Long speech input is split at sentence boundaries into segments of about this many characters."
    )
    speech_concurrent_segments: int = option(2, "Segments of one speech request synthesised at once.")
    run_lease_s: float = option(
        2.0,
        "A gateway process renews the leases of its runs in Redis every quarter of this; a run whose lease ran "
        "out (its process died or hangs) is taken over by another process, which continues it from its journal.",
    )
    run_queue: str = option(
        "chorus:runs",
        "Redis stream of the runs in progress: gateway processes sharing it take over each other's runs (one per "
        "deployment sharing a Redis).",
    )
    max_failovers: int = option(3, "Times one stream may move to another backend replica when its replica fails.")
    stall_s: float = option(
        2.0, "A stream waiting this long for its backend replica's next message probes the replica's health."
    )
    probe_timeout_s: float = option(2.0, "A replica that does not answer that probe in this time counts as hung.")
    replica_wait_s: float = option(
        5.0, "How long a stream failing over waits for a healthy replica (e.g. one restarting) before it fails."
    )

    def __post_init__(self) -> None:
        check_redis_url(self.redis_url)
        if self.workers < 1:
            raise ValueError(f"workers: must be at least 1, got {self.workers}")
        if self.admission_split < 1:
            raise ValueError(f"admission_split: must be at least 1, got {self.admission_split}")
        for name in ("talker_max_in_flight", "vocoder_max_in_flight", "diffusion_max_in_flight"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be at least 0 (0: what the backend's replicas report they serve)")
        if self.max_failovers < 0:
            raise ValueError(f"max_failovers: must be at least 0, got {self.max_failovers}")
        if self.encoder_threads < 0:
            raise ValueError(f"encoder_threads: must be at least 0, got {self.encoder_threads}")
        if self.rest_keep_alive_s <= 0:
            raise ValueError(f"rest_keep_alive_s: must be above 0, got {self.rest_keep_alive_s}")

    @property
    def encoder_thread_count(self) -> int:
        """`encoder_threads`, or this process's share of the cores when 0."""
        return self.encoder_threads or default_encoder_threads(self.workers)

    @property
    def failover(self) -> FailoverPolicy:
        return FailoverPolicy(self.max_failovers, self.stall_s, self.probe_timeout_s, self.replica_wait_s)

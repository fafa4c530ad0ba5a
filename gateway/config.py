"""Gateway settings (flags `chorus serve gateway --help`, env vars CHORUS_GATEWAY_*)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chorus.runtime.config import ServiceConfig, option


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayConfig(ServiceConfig):
    env_prefix: ClassVar[str] = "CHORUS_GATEWAY_"

    rest_host: str = option("127.0.0.1", "Address the REST API binds to (0.0.0.0 in containers).")
    rest_port: int = option(8000, "REST API port; 0 picks a free one.")
    redis_url: str = option("redis://127.0.0.1:6379/0", "Redis holding request state (REDIS_URL also works).")
    talker_targets: tuple[str, ...] = option(("127.0.0.1:50051",), "Talker replicas, host:port, comma-separated.")
    vocoder_targets: tuple[str, ...] = option(("127.0.0.1:50052",), "Vocoder replicas, host:port, comma-separated.")
    diffusion_targets: tuple[str, ...] = option(("127.0.0.1:50053",), "Diffusion replicas, host:port, comma-separated.")
    health_interval_s: float = option(1.0, "How often each backend replica's health is checked.")

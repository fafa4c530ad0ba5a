"""Prometheus metrics shared by every process, and the /metrics HTTP endpoint."""

from __future__ import annotations

import os

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server

RPCS = Counter("chorus_rpcs", "gRPC calls handled, by method and final status code.", ["service", "method", "code"])
RPC_SECONDS = Histogram(
    "chorus_rpc_seconds",
    "gRPC call duration in seconds (whole stream for streaming calls).",
    ["service", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
# Gauges say how processes of one service combine when several share a metrics directory (gateway workers).
RPCS_IN_FLIGHT = Gauge("chorus_rpcs_in_flight", "gRPC calls running now.", ["service"], multiprocess_mode="livesum")
SERVING = Gauge(
    "chorus_serving", "1 when the service reports SERVING on its health endpoint.", ["service"],
    multiprocess_mode="livemin",
)  # fmt: skip


def metrics_registry() -> CollectorRegistry:
    """What /metrics reports: this process's metrics, or with `PROMETHEUS_MULTIPROC_DIR` set, those of every
    process writing there, merged."""
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def serve_metrics(host: str, port: int, registry: CollectorRegistry = REGISTRY) -> int | None:
    """Starts the /metrics HTTP endpoint in a daemon thread; returns its port (None when disabled)."""
    if port < 0:
        return None
    httpd, _ = start_http_server(port, addr=host, registry=registry)
    return httpd.server_port

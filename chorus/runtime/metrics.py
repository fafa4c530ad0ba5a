"""Prometheus metrics shared by every process, and the /metrics HTTP endpoint."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, multiprocess, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chorus.runtime.gc_pauses import GcPauseCollector

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


class CudaMemoryCollector(Collector):
    """GPU memory of this process, per device, read from PyTorch's caching allocator at scrape time: what
    tensors hold (`allocated`), what the allocator holds from the driver (`reserved`, what other processes
    cannot have) and the peaks of both since start. Empty until the process has used CUDA, so it never
    initialises CUDA (or imports torch) itself."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return
        stats = {
            "allocated": torch.cuda.memory_allocated,
            "reserved": torch.cuda.memory_reserved,
            "max_allocated": torch.cuda.max_memory_allocated,
            "max_reserved": torch.cuda.max_memory_reserved,
        }
        for name, read in stats.items():
            family = GaugeMetricFamily(
                f"chorus_cuda_memory_{name}_bytes", f"PyTorch CUDA memory {name.replace('_', ' ')}.", labels=["device"]
            )
            for index in range(torch.cuda.device_count()):
                family.add_metric([str(index)], read(index))
            yield family


REGISTRY.register(CudaMemoryCollector())
REGISTRY.register(GcPauseCollector())


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

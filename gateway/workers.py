"""`chorus serve gateway --workers N`: N gateway processes behind the same REST and gRPC ports.

One gateway process is one event loop on one core, and under load its per-chunk work (gRPC relays, journal
writes, encoding) fills that core long before the GPU is full. Workers need little from each other: request
state lives in Redis, exactly as it does across replicas, so each worker is a replica that shares the ports
(SO_REUSEPORT: the kernel spreads new connections over them, by a hash rather than by load). Admission limits
are the gateway's, not each worker's: the workers count their slots in one file (`chorus.gateway.host_slots`),
so N workers admit what the backends serve, not N times it, and a request waits only when the backend is full,
not because its connection landed on a worker whose fixed share was. Their metrics are merged
through prometheus_client's multiprocess mode: the workers write to a shared directory, and every /metrics
endpoint (this process's metrics port, each worker's REST /metrics) reports the sum.

This process only supervises. SIGTERM/SIGINT are passed on (each worker drains as a single gateway does); a
worker that exits on its own stops the others, and this process exits with its code, so whatever restarts the
gateway (Kubernetes, `chorus up`) sees one failure rather than a gateway quietly running short of workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from chorus.gateway import host_slots
from chorus.gateway.config import GatewayConfig
from chorus.runtime.config import to_environ
from chorus.runtime.metrics import metrics_registry, serve_metrics
from chorus.runtime.processes import die_with_parent, free_port

log = logging.getLogger("chorus.gateway.workers")


def worker_config(config: GatewayConfig) -> GatewayConfig:
    """The settings of each of `config.workers` processes: one process, on the same ports (picked here where 0),
    a share of the host's encoder threads, no metrics port of its own (this process serves theirs). The admission
    limits stay the gateway's: the workers share them (`host_slots`)."""
    return dataclasses.replace(
        config,
        workers=1,
        encoder_threads=config.encoder_thread_count,
        port=config.port or free_port(config.host),
        rest_port=config.rest_port or free_port(config.rest_host),
        metrics_port=-1,
    )


def run_workers(config: GatewayConfig) -> int:
    """Runs `config.workers` gateways until a signal (exit code 0) or until one exits (its code)."""
    metrics_dir = tempfile.mkdtemp(prefix="chorus-gateway-metrics-")
    slots_path = os.path.join(metrics_dir, "admission-slots")  # not a metrics file: prometheus_client reads *.db
    host_slots.create(slots_path, config.workers)
    settings = worker_config(config)
    env = os.environ | to_environ(settings) | {"PROMETHEUS_MULTIPROC_DIR": metrics_dir}
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # this process's /metrics reads what they write
    stopping = False
    workers: list[subprocess.Popen] = []

    def on_signal(signum: int, _frame) -> None:
        nonlocal stopping
        stopping = True
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Each in its own session: a terminal's Ctrl-C reaches only this process, which passes it on once.
    for index in range(config.workers):
        command = [sys.executable, "-m", "chorus.cli", "serve", "gateway"]
        worker_env = env | host_slots.worker_environ(slots_path, index, config.workers)
        workers.append(subprocess.Popen(command, env=worker_env, start_new_session=True, preexec_fn=die_with_parent))
    metrics_port = serve_metrics(config.host, config.metrics_port, metrics_registry())
    log.info(
        "%d gateway workers on REST port %d and gRPC port %d (metrics port %s)",
        config.workers, settings.rest_port, settings.port, metrics_port,
    )  # fmt: skip
    failed = None
    try:
        while running := [worker for worker in workers if worker.poll() is None]:
            if not stopping and len(running) < len(workers):
                failed = next(worker for worker in workers if worker.returncode is not None)
                log.error("gateway worker %d exited with code %d; stopping the others", failed.pid, failed.returncode)
                on_signal(signal.SIGTERM, None)
            time.sleep(0.2)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if failed is None and not stopping:  # they all ended at once, unasked
        failed = workers[0]
    return 0 if failed is None else (failed.returncode or 1)

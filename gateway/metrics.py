"""The gateway's Prometheus metrics (served on the runtime's /metrics port and on REST /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter(
    "chorus_gateway_requests", "API requests finished, by endpoint and outcome.", ["endpoint", "outcome"]
)
TIME_TO_FIRST_AUDIO_S = Histogram(
    "chorus_gateway_time_to_first_audio_seconds",
    "Request accepted → first audio bytes sent.",
    ["kind"],
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10),
)
REAL_TIME_FACTOR = Histogram(
    "chorus_gateway_real_time_factor",
    "Wall time / audio duration per finished request (below 1 is faster than real time).",
    ["kind"],
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5),
)
QUEUE_DEPTH = Gauge(
    "chorus_gateway_queue_depth", "Requests waiting for a backend slot.", ["backend"], multiprocess_mode="livesum"
)
IN_FLIGHT = Gauge(
    "chorus_gateway_in_flight", "Requests holding a backend slot.", ["backend"], multiprocess_mode="livesum"
)
MAX_IN_FLIGHT = Gauge(
    "chorus_gateway_max_in_flight",
    "Backend slots the gateway admits requests to (its admission limit, which its workers share).",
    ["backend"],
    multiprocess_mode="livemax",
)
RUNS_TAKEN_OVER = Counter(
    "chorus_gateway_runs_taken_over",
    "Runs this process took over from a gateway process that stopped renewing their lease (it died, hung, or was "
    "too busy to renew it in time).",
)
RUNS_LOST = Counter(
    "chorus_gateway_runs_lost",
    "Runs another gateway process took over while this one still ran them: the lease lapsed on a live process (an "
    "event loop stalled longer than run_lease_s), so their backend work ran twice. Above zero without faults: "
    "raise run_lease_s or give the gateway more CPU.",
)
REDIS_SECONDS = Histogram(
    "chorus_gateway_redis_seconds",
    "Latency of the gateway's Redis round trips.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
)


class CountOutcomes:
    """ASGI middleware counting finished HTTP requests by route template and status code.

    Pure ASGI (not BaseHTTPMiddleware) so streamed audio passes through untouched.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_code = 500  # the app raised before it could answer

        async def recording_send(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route = scope.get("route")
            REQUESTS.labels(route.path if route is not None else "unmatched", str(status_code)).inc()

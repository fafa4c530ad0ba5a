"""The REST API (FastAPI). Handlers stay thin: validation, then the gateway's orchestration."""

from __future__ import annotations

import asyncio

import redis.asyncio as redis
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from chorus.gateway.backends import BackendPool


def create_app(backends: BackendPool, redis_client: redis.Redis) -> FastAPI:
    app = FastAPI(title="Chorus", version="0.1.0", summary="Text-to-speech and text-to-audio serving.")

    @app.get("/health", tags=["operations"])
    async def health() -> dict[str, str]:
        """Liveness: the gateway process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"])
    async def ready() -> JSONResponse:
        """Readiness: Redis answers and every backend has a healthy replica."""
        try:
            is_redis_up = bool(await asyncio.wait_for(redis_client.ping(), timeout=1.0))
        except (redis.RedisError, OSError, TimeoutError):
            is_redis_up = False
        is_ready = is_redis_up and backends.is_ready()
        body = {"ready": is_ready, "redis": is_redis_up, "backends": backends.status()}
        return JSONResponse(body, status_code=200 if is_ready else 503)

    return app

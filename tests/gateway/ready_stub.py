"""A stand-in for a gateway's `GET /ready` on loopback: what the bench reads to find the backends."""

from __future__ import annotations

import contextlib

from aiohttp import web


@contextlib.asynccontextmanager
async def serving_ready(backends: dict[str, dict[str, bool]]):
    """Its URL while it answers `/ready` with `backends` ({kind: {target: is_healthy}})."""

    async def ready(_):
        return web.json_response({"ready": True, "backends": backends})

    app = web.Application()
    app.router.add_get("/ready", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    finally:
        await runner.cleanup()

"""The REST API's idle connections: the gateway keeps one open longer than clients keep it in their pools, so a
client never sends a request on a connection the server is closing (aiohttp: 'Server disconnected')."""

from __future__ import annotations

import asyncio

import pytest

from chorus.gateway.config import GatewayConfig

REQUEST = b"GET /health HTTP/1.1\r\nhost: chorus\r\n\r\n"


async def _answered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Sends GET /health on an open connection: whether a whole 200 answer came back (else the server closed it)."""
    writer.write(REQUEST)
    await writer.drain()
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    except (asyncio.IncompleteReadError, ConnectionError):
        return False
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return head.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(("keep_alive_s", "stays_open"), [(0.3, False), (3.0, True)])
async def test_an_idle_rest_connection_stays_open_for_rest_keep_alive_s(
    start_gateway, redis_url, keep_alive_s, stays_open
):
    async with start_gateway(redis_url, rest_keep_alive_s=keep_alive_s) as (gateway, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.rest_port)
        try:
            assert await _answered(reader, writer)
            await asyncio.sleep(1.0)
            assert await _answered(reader, writer) is stays_open
        finally:
            writer.close()


def test_the_default_outlasts_the_idle_limits_of_common_client_pools():
    assert GatewayConfig().rest_keep_alive_s > 15.0  # httpx keeps idle connections 5 s, aiohttp 15 s
    with pytest.raises(ValueError, match="rest_keep_alive_s"):
        GatewayConfig(rest_keep_alive_s=0)

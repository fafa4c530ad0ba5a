"""The web page's files as the gateway serves them: no browser, no backends."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

import httpx

from chorus.gateway.config import GatewayConfig
from chorus.gateway.context import GatewayContext
from chorus.gateway.rest import WEB_DIR, create_app

ROOT = Path(__file__).resolve().parents[2]
CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
URL = re.compile(r"https?://([^/\s\"'`)]+)")
MODULE_IMPORT = re.compile(r"""(?:import|from)\s+["'](\./[\w.]+)["']""")
PAGE_ASSET = re.compile(r"""(?:src|href)="(/web/[\w./]+)\"""")


async def test_the_page_and_every_asset_it_loads_are_served(redis_url):
    ctx = GatewayContext.from_config(GatewayConfig(redis_url=redis_url))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(create_app(ctx)), base_url="http://test") as http:
            page = await http.get("/")
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert "<title>Chorus</title>" in page.text
            # Follow what the browser would load: the page's assets, then each module's imports.
            pending, served = PAGE_ASSET.findall(page.text), {}
            while pending:
                path = pending.pop()
                if path in served:
                    continue
                reply = await http.get(path)
                assert reply.status_code == 200, path
                suffix = Path(path).suffix
                assert reply.headers["content-type"].split(";")[0] == CONTENT_TYPES[suffix], path
                served[path] = reply.text
                if suffix == ".js":
                    pending += ["/web/" + name.removeprefix("./") for name in MODULE_IMPORT.findall(reply.text)]
            missing = await http.get("/web/no-such-file.js")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    finally:
        await ctx.redis.aclose()
    # Every file ships for a reason: the page reaches all of them.
    assert {f"/web/{file.name}" for file in WEB_DIR.iterdir() if file.suffix != ".html"} == set(served)


def test_assets_name_no_external_host():
    # The page works offline: no CDN, font or analytics URL anywhere.
    for file in WEB_DIR.iterdir():
        hosts = {host for host in URL.findall(file.read_text()) if host.split(":")[0] not in ("localhost", "127.0.0.1")}
        assert not hosts, f"{file.name} names {hosts}"


def test_the_package_data_ships_every_web_file():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "chorus.gateway.web" in setuptools["packages"]
    patterns = setuptools["package-data"]["chorus.gateway.web"]
    for file in WEB_DIR.iterdir():
        assert any(fnmatch.fnmatch(file.name, pattern) for pattern in patterns), f"{file.name} is not package data"

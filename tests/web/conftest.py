"""Web page tests: the whole stack as `chorus up` runs it (tiny models, real Redis, real gRPC services)
and a headless Debian Chromium driven by Playwright."""

from __future__ import annotations

import shutil

import pytest

from chorus.stack import LocalStack, StackPorts

STARTUP_TIMEOUT_S = 120
# Tiny random-weight talkers rarely emit EOS: cap each request at ~3 s of audio, sent in ~0.3 s
# chunks, so a stream arrives in several pieces and the test stays short.
TALKER_ENV = {"CHORUS_TALKER_MAX_FRAMES": "40", "CHORUS_TALKER_CHUNK_FRAMES": "4"}
CHROMIUM_FLAGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",  # grants the microphone without a prompt
    "--use-fake-device-for-media-stream",  # a synthetic microphone (a beep)
)


@pytest.fixture(scope="module")
def stack_url(redis_url) -> str:
    """The REST base URL of a running local stack (talker, vocoder, diffusion, gateway)."""
    stack = LocalStack(StackPorts.choose(0, 0), redis_url=redis_url, grace_s=2.0, extra_env=TALKER_ENV)
    stack.start()
    try:
        stack.wait_ready(STARTUP_TIMEOUT_S)
        yield f"http://127.0.0.1:{stack.ports.rest}"
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def chromium():
    """Debian's Chromium under Playwright (never `playwright install`: its CDN is not reachable)."""
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not on PATH: run `bash deploy/tools/install-chromium.sh` (make test does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=list(CHROMIUM_FLAGS))
        yield browser
        browser.close()

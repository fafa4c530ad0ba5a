"""The real tiny talker and vocoder services on loopback, with a gateway in front (real Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import io

import av
import numpy as np

from chorus.runtime.host import ServiceHost
from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.service import VocoderService

SAMPLE_RATE_HZ = 24_000


@contextlib.asynccontextmanager
async def hosted(config, service):
    host = ServiceHost(config, service)
    await host.start()
    try:
        yield f"127.0.0.1:{host.port}"
    finally:
        await host.stop()


@contextlib.asynccontextmanager
async def speech_stack(
    start_gateway,
    redis_url: str,
    cache_dir: str,
    talker_overrides: dict | None = None,
    vocoder_overrides: dict | None = None,
    **gateway,
):
    """`(gateway, http, gateway_target, talker_target, vocoder_target)` once both backends are healthy."""
    talker_settings = dict(
        device="cpu", metrics_port=-1, max_streams=4, chunk_frames=4, max_frames=40, grace_s=1.0,
        cache_dir=cache_dir, use_cuda_graphs=False,
    )  # fmt: skip
    talker_config = TalkerConfig(**(talker_settings | (talker_overrides or {})))
    vocoder_settings = dict(device="cpu", metrics_port=-1, max_streams=4, grace_s=1.0)
    vocoder_config = VocoderConfig(**(vocoder_settings | (vocoder_overrides or {})))
    async with (
        hosted(talker_config, TalkerService(talker_config)) as talker,
        hosted(vocoder_config, VocoderService(vocoder_config)) as vocoder,
        start_gateway(redis_url, talker_targets=(talker,), vocoder_targets=(vocoder,), **gateway) as (
            service,
            http,
            target,
        ),
    ):
        await until_healthy(service)
        yield service, http, target, talker, vocoder


async def until_healthy(gateway, kinds: tuple[str, ...] = ("talker", "vocoder")) -> None:
    """Waits (up to 10 s) until the gateway has seen a healthy replica of each backend in `kinds`."""
    backends = gateway.context.backends
    for _ in range(200):
        if all(backends.replicas[kind][0].is_healthy for kind in kinds):
            return
        await asyncio.sleep(0.05)


def reference_wav(duration_s: float = 1.0) -> bytes:
    """A tone as a WAV file (one second by default): a voice-clone reference."""
    num_samples = int(duration_s * SAMPLE_RATE_HZ)
    waveform = np.sin(np.linspace(0, 2000 * duration_s, num_samples)).astype(np.float32) * 0.3
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="wav") as container:
        stream = container.add_stream("pcm_s16le", rate=SAMPLE_RATE_HZ, layout="mono")
        frame = av.AudioFrame.from_ndarray((waveform * 32767).astype(np.int16)[None, :], format="s16", layout="mono")
        frame.rate = SAMPLE_RATE_HZ
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return buffer.getvalue()

"""The gateway's encoder threads: a share of the host's cores per process, and denormals flushed to zero."""

from __future__ import annotations

import io
import os
import platform
import sys
import threading

import av
import numpy as np
import pytest

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.audio.encoder_threads import default_encoder_threads, encoder_threads, flushes_denormals
from chorus.gateway.config import GatewayConfig
from chorus.gateway.workers import worker_config

SUPPORTED = sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64")


def decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.concatenate([frame.to_ndarray().ravel() for frame in container.decode(audio=0)])


def denormal_product() -> float:
    """1e-38 × 0.01 in float32: 1e-40, a denormal, unless this thread flushes it to zero."""
    return float(np.array([1e-38], np.float32)[0] * np.float32(0.01))


@pytest.mark.skipif(not SUPPORTED, reason="flushing denormals is set up on Linux x86-64 and aarch64")
def test_encoder_threads_flush_denormals_and_the_caller_does_not():
    threads = encoder_threads(2)
    try:
        assert threads.submit(flushes_denormals).result() is True
        assert threads.submit(denormal_product).result() == 0.0
    finally:
        threads.shutdown()
    assert flushes_denormals() is False  # the caller's arithmetic is left as it was
    assert denormal_product() == pytest.approx(1e-40, rel=1e-3)


async def test_chunks_are_encoded_on_the_threads_given():
    threads = encoder_threads(1)
    encoder = StreamingEncoder("opus", 24_000, threads=threads)
    ran_on = []
    encode = encoder.encode
    encoder.encode = lambda samples: ran_on.append(threading.current_thread().name) or encode(samples)
    try:
        await encoder.encode_async(np.zeros(2_400, np.float32))
    finally:
        encoder.close()
        threads.shutdown()
    assert len(ran_on) == 1 and ran_on[0].startswith("encoder")


async def test_flushing_denormals_keeps_the_encoded_audio():
    """Speech-level audio decodes the same with and without flushing (the files' bytes differ anyway: each Ogg
    stream gets a random serial number)."""
    samples = (0.3 * np.sin(np.arange(48_000) * 2 * np.pi * 220 / 24_000)).astype(np.float32)
    files = []
    threads = encoder_threads(1)
    try:
        for executor in (None, threads):
            encoder = StreamingEncoder("opus", 24_000, threads=executor)
            parts = [await encoder.encode_async(samples[i : i + 1920]) for i in range(0, samples.size, 1920)]
            files.append(b"".join(parts) + await encoder.flush_async())
    finally:
        threads.shutdown()
    unflushed, flushed = (decoded(data) for data in files)
    assert unflushed.shape == flushed.shape and np.abs(unflushed).max() > 0.2
    np.testing.assert_allclose(flushed, unflushed, rtol=0, atol=1e-6)


def test_each_gateway_process_gets_a_share_of_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert default_encoder_threads(1) == max(2, cores)
    assert default_encoder_threads(cores) == 2  # at least two, however many processes
    assert worker_config(GatewayConfig(workers=4)).encoder_threads == default_encoder_threads(4)
    assert worker_config(GatewayConfig(workers=4, encoder_threads=3)).encoder_threads == 3  # as set
    with pytest.raises(ValueError, match="encoder threads"):
        encoder_threads(0)
    with pytest.raises(ValueError, match="encoder_threads"):
        GatewayConfig(encoder_threads=-1)

"""The gateway's encoder threads: a share of the host's cores per process, denormals flushed to zero, and the most
pressing encode first."""

from __future__ import annotations

import asyncio
import io
import os
import platform
import sys
import threading
import time
from concurrent.futures import Future

import av
import numpy as np
import pytest

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.audio.encoder_threads import (
    MAX_DEFAULT_ENCODER_THREADS,
    EncoderThreads,
    default_encoder_threads,
    flushes_denormals,
    stream_order,
)
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
    threads = EncoderThreads(2)
    try:
        assert threads.submit(flushes_denormals).result() is True
        assert threads.submit(denormal_product).result() == 0.0
    finally:
        threads.shutdown()
    assert flushes_denormals() is False  # the caller's arithmetic is left as it was
    assert denormal_product() == pytest.approx(1e-40, rel=1e-3)


async def test_chunks_are_encoded_on_the_threads_given():
    threads = EncoderThreads(1)
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
    threads = EncoderThreads(1)
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
    assert default_encoder_threads(1) == min(cores, MAX_DEFAULT_ENCODER_THREADS)
    assert default_encoder_threads(cores) == 1  # a process per core: one thread each
    assert default_encoder_threads(2 * cores) == 1  # at least one, however many processes
    assert worker_config(GatewayConfig(workers=4)).encoder_threads == default_encoder_threads(4)
    assert worker_config(GatewayConfig(workers=4, encoder_threads=3)).encoder_threads == 3  # as set
    with pytest.raises(ValueError, match="encoder threads"):
        EncoderThreads(0)
    with pytest.raises(ValueError, match="encoder_threads"):
        GatewayConfig(encoder_threads=-1)


def hold(threads: EncoderThreads) -> tuple[threading.Event, Future]:
    """Keeps the pool's one thread busy (once this returns, it is) until the event is set."""
    started, release = threading.Event(), threading.Event()
    busy = threads.submit(lambda: started.set() or release.wait())
    assert started.wait(timeout=5)
    return release, busy


def run_in_order(threads: EncoderThreads, submit) -> list[str]:
    """The names `submit(record)` queues, in the order one busy thread then runs them."""
    ran = []
    release, busy = hold(threads)
    futures = submit(ran.append)
    release.set()
    busy.result(timeout=5)
    for future in futures:
        future.result(timeout=5)
    return ran


def test_the_threads_run_the_most_pressing_call_first():
    now_s, threads = time.monotonic(), EncoderThreads(1)
    try:
        ran = run_in_order(
            threads,
            lambda record: [
                threads.submit(record, "whole file, submitted now"),
                threads.submit_ordered(stream_order(now_s - 1, now_s - 0.5, 5.0, now_s), record, "younger stream"),
                threads.submit_ordered(stream_order(now_s - 2, now_s - 1.5, 8.0, now_s), record, "older stream"),
                threads.submit_ordered(stream_order(now_s - 1, now_s - 0.9, 1.2, now_s), record, "listener close"),
                threads.submit_ordered(stream_order(now_s, None, 0.0, now_s), record, "newcomer"),
            ],
        )
    finally:
        threads.shutdown()
    assert ran == ["newcomer", "listener close", "older stream", "younger stream", "whole file, submitted now"]


async def test_a_streams_encode_waits_behind_a_more_pressing_one():
    threads, now_s = EncoderThreads(1), time.monotonic()
    older, newcomer = (StreamingEncoder("mp3", 24_000, threads=threads) for _ in range(2))
    ran = []
    for name, encoder in (("older", older), ("newcomer", newcomer)):
        encode = encoder.encode
        encoder.encode = lambda samples, name=name, encode=encode: ran.append(name) or encode(samples)
    release, busy = hold(threads)
    chunk = np.zeros(2_400, np.float32)
    try:
        encodes = [
            asyncio.ensure_future(older.encode_async(chunk, stream_order(now_s - 5, now_s - 4, 9.0, now_s))),
            asyncio.ensure_future(newcomer.encode_async(chunk, stream_order(now_s, None, 0.0, now_s))),
        ]
        await asyncio.sleep(0.05)  # both queued behind the busy thread
        release.set()
        await asyncio.gather(*encodes)
        busy.result(timeout=5)
    finally:
        for encoder in (older, newcomer):
            encoder.close()
        threads.shutdown()
    assert ran == ["newcomer", "older"]


def test_shutdown_cancels_what_waits_when_asked_and_refuses_more():
    threads = EncoderThreads(1)
    release, busy = hold(threads)
    waiting = threads.submit(lambda: "never")
    threads.shutdown(wait=False, cancel_futures=True)
    release.set()
    assert busy.result(timeout=5) is True and waiting.cancelled()
    with pytest.raises(RuntimeError, match="after shutdown"):
        threads.submit(lambda: None)


def test_an_error_reaches_the_caller():
    threads = EncoderThreads(1)
    try:
        with pytest.raises(ZeroDivisionError):
            threads.submit(lambda: 1 / 0).result(timeout=5)
        assert threads.submit(lambda: "still running").result(timeout=5) == "still running"
    finally:
        threads.shutdown()

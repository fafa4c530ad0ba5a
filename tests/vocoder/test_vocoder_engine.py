"""The decode engine: concurrent streams batched into shared forwards, exact audio, and state freed on
finish, cancel and abandon."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time

import numpy as np
import pytest
import torch
from vocoder_helpers import random_codes, until_no_live_streams

from chorus.runtime.errors import InvalidRequest, Overloaded, Unavailable
from chorus.vocoder.engine.engine import (
    BatchReport,
    DecodeEngine,
    DecodeStream,
    EngineSettings,
    StreamEnded,
    batch_counts,
)
from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.engine.stream import StreamStatus


@pytest.fixture
async def engine(tiny_codec):
    reports: list[BatchReport] = []
    engine = DecodeEngine(
        CodecRunner(tiny_codec.decoder, max_streams=4),
        EngineSettings(max_batch_size=3, batch_window_s=0.005, idle_timeout_s=1.0),  # a loaded CI box stalls
        on_batch=reports.append,
    )
    engine.reports = reports
    await engine.start()
    yield engine
    await engine.stop()


def _one_shot(decoder, codes: torch.Tensor) -> np.ndarray:
    with torch.inference_mode():
        waveform, _ = decoder(codes, decoder.new_state(1))
    return waveform[0].numpy()


async def _run_stream(engine, codes: torch.Tensor, chunk_sizes: list[int], context: torch.Tensor | None = None):
    async with engine.open_stream("r", None if context is None else context[0].numpy()) as stream:

        async def produce():
            start = 0
            for size in chunk_sizes:
                await stream.send(codes[0, start : start + size].numpy())
                start += size
                await asyncio.sleep(0)
            stream.end_input()

        producer = asyncio.create_task(produce())
        pieces = [piece async for piece in stream]
        await producer
    offsets = [piece.sample_offset for piece in pieces]
    assert offsets == sorted(offsets) and offsets[0] == 0
    return np.concatenate([piece.waveform for piece in pieces]), stream.status


async def _get_ahead(stream, codes: torch.Tensor) -> None:
    """Sends a stream 50 frames (`codes` of one stream) and reads their audio: 4 s of it, decoded in well under a
    second, so the stream is seconds ahead of its listener."""
    await stream.send(codes[:50].numpy())
    while stream.num_frames_decoded < 50:
        await anext(stream)


def _hold_decodes(runner: CodecRunner, count: int) -> list[tuple[threading.Event, threading.Event]]:
    """From now on, each of the runner's next `count` batches sets its `held` and runs only once the test sets its
    `release`: (held, release) per batch."""
    holds = [(threading.Event(), threading.Event()) for _ in range(count)]
    decode, decoded = runner.decode, []

    def decode_held(*args):
        index = len(decoded)
        decoded.append(index)
        if index < count:
            held, release = holds[index]
            held.set()
            assert release.wait(10)
        return decode(*args)

    runner.decode = decode_held
    return holds


async def test_concurrent_streams_are_batched_and_exact(engine, tiny_codec):
    decoder = tiny_codec.decoder
    streams = [random_codes(n, seed=200 + n) for n in (51, 30, 76)]
    patterns = [[1, 25, 25], [1, 4, 25], [1] + [25] * 3]
    results = await asyncio.gather(*(_run_stream(engine, c, p) for c, p in zip(streams, patterns, strict=True)))
    for codes, (waveform, status) in zip(streams, results, strict=True):
        assert status is StreamStatus.FINISHED
        assert np.abs(waveform - _one_shot(decoder, codes)).max() <= 1e-5
    stats = engine.stats()
    assert stats.num_frames_decoded == 51 + 30 + 76
    assert stats.num_batches == len(engine.reports) < sum(len(p) for p in patterns), "no forward was shared"
    assert max(report.batch_size for report in engine.reports) > 1
    assert sum(report.audio_s for report in engine.reports) == pytest.approx((51 + 30 + 76) * 0.08)
    assert stats.live_streams == 0 and stats.state_bytes == 0 and stats.free_slots == 4


async def test_chunks_are_decoded_in_the_allowed_piece_lengths_and_stay_exact(tiny_codec):
    reports: list[BatchReport] = []
    engine = DecodeEngine(
        CodecRunner(tiny_codec.decoder, max_streams=2),
        EngineSettings(max_batch_size=2, batch_window_s=0.005, piece_lengths=(1, 2, 4, 8)),
        on_batch=reports.append,
    )
    await engine.start()
    try:
        codes = random_codes(40, seed=7)
        waveform, status = await _run_stream(engine, codes, [1, 12, 27])
    finally:
        await engine.stop()
    assert status is StreamStatus.FINISHED
    assert {report.num_frames for report in reports} <= {1, 2, 4, 8}
    assert sum(report.audio_s for report in reports) == pytest.approx(40 * 0.08)
    assert np.abs(waveform - _one_shot(tiny_codec.decoder, codes)).max() <= 1e-5


async def test_a_streams_last_frames_decode_as_one_padded_piece_and_stay_exact(tiny_codec):
    """19 last frames, where 16 + 2 + 1 would take three decodes: one of 25 frames, whose last 6 are padding that
    the causal decoder's 19 first frames of audio do not depend on."""
    reports: list[BatchReport] = []
    settings = EngineSettings(batch_window_s=0.0, piece_lengths=(1, 2, 4, 8, 16, 25))
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=2), settings, on_batch=reports.append)
    await engine.start()
    try:
        codes = random_codes(44, seed=11)
        async with engine.open_stream("r") as stream:
            await stream.send(codes[0, :25].numpy())
            assert (await anext(stream)).num_frames == 25
            await stream.send(codes[0, 25:].numpy())
            stream.end_input()
            pieces = [piece async for piece in stream]
    finally:
        await engine.stop()
    assert [(piece.num_frames, piece.waveform.shape[0]) for piece in pieces] == [(19, 19 * 1920)]
    assert [(report.num_frames, report.audio_s) for report in reports[1:]] == [(25, pytest.approx(19 * 0.08))]
    expected = _one_shot(tiny_codec.decoder, codes)[25 * 1920 :]
    assert np.abs(pieces[0].waveform - expected).max() <= 1e-5


async def test_context_codes_prime_without_output(engine, tiny_codec):
    context, generated = random_codes(40, seed=1), random_codes(30, seed=2)
    waveform, _ = await _run_stream(engine, generated, [1, 29], context=context)
    expected = _one_shot(tiny_codec.decoder, torch.cat([context, generated], dim=1))[40 * 1920 :]
    assert waveform.shape == expected.shape
    assert np.abs(waveform - expected).max() <= 1e-5


async def test_state_freed_after_finish_cancel_and_abandon(engine):
    finished = engine.open_stream("finished")
    await finished.send(random_codes(3, seed=1)[0].numpy())
    finished.end_input()
    assert [p.num_frames async for p in finished] == [3]

    cancelled = engine.open_stream("cancelled")
    await cancelled.send(random_codes(60, seed=2)[0].numpy())
    assert (engine.stats().live_streams, engine.stats().queued_streams) == (1, 1)
    cancelled.close()

    abandoned = engine.open_stream("abandoned")  # the client vanished: nobody sends, nobody reads
    await abandoned.send(random_codes(5, seed=3)[0].numpy())
    assert engine.stats().state_bytes == engine.runner.bytes_per_stream > 0
    await until_no_live_streams(engine)
    stats = engine.stats()
    assert (stats.live_streams, stats.state_bytes, stats.free_slots) == (0, 0, 4)
    assert (finished.status, cancelled.status, abandoned.status) == (
        StreamStatus.FINISHED,
        StreamStatus.CANCELLED,
        StreamStatus.ABANDONED,
    )
    with pytest.raises(StreamEnded, match="abandoned"):
        await abandoned.send(random_codes(1, seed=4)[0].numpy())


async def test_overload_and_bad_codes_are_refused(engine):
    streams = [engine.open_stream(f"s{i}") for i in range(4)]
    with pytest.raises(Overloaded):
        engine.open_stream("one too many")
    with pytest.raises(InvalidRequest, match=r"codes: expected \(frames, 16\)"):
        await streams[0].send(np.zeros((2, 8), dtype=np.int64))
    bad = np.zeros((2, 16), dtype=np.int64)
    bad[1, 3] = 2048
    with pytest.raises(InvalidRequest, match=r"codes: codes must be in \[0, 2048\), got 2048 at frame 1, codebook 3"):
        await streams[0].send(bad)
    streams[3].close()
    with pytest.raises(InvalidRequest, match="context_codes: expected"):
        engine.open_stream("bad context", context_codes=np.zeros((3, 15), dtype=np.int64))
    assert engine.stats().free_slots == 1, "a refused open must not keep a slot"
    for stream in streams:
        stream.close()
    assert engine.stats().live_streams == 0


async def test_stop_right_after_a_read_returns(tiny_codec):
    """The read wakes the engine task as stop() lands; stopping must still finish (no lost cancellation)."""
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=1))
    await engine.start()
    async with engine.open_stream("last") as stream:
        await stream.send(random_codes(1, seed=9)[0].numpy())
        await anext(stream)
    await asyncio.wait_for(engine.stop(), timeout=10)
    with pytest.raises(Unavailable):
        engine.open_stream("after stop")


def _growing_chunks(num_frames: int, max_frames: int = 25) -> list[int]:
    """The talker's chunking: 1, 2, 4, … up to `max_frames` frames (fewer at the end)."""
    sizes: list[int] = []
    while sum(sizes) < num_frames:
        sizes.append(min(max_frames, 1 << len(sizes), num_frames - sum(sizes)))
    return sizes


async def test_streams_closed_mid_batch_and_newcomers_in_their_slots_leave_the_others_exact(tiny_codec):
    """What a surviving vocoder replica sees when a talker replica dies: two of four streams are closed while
    their pieces are in flight (inside the batch hook, so the close lands between the decode and its outputs),
    two new streams take the freed state slots; the two streams that go on must decode exactly as one-shot,
    and so must the newcomers (their reused slots start fresh)."""
    num_frames = 60
    codes = [random_codes(num_frames, seed=400 + i)[0].numpy() for i in range(6)]
    streams: dict[int, DecodeStream] = {}
    closed_slots: list[int] = []

    def close_two_mid_batch(report: BatchReport) -> None:
        if closed_slots or report.batch_size < 2:
            return
        for index in (1, 2):
            closed_slots.append(streams[index]._record.slot)
            assert streams[index]._record.is_in_flight, "the close must land while the stream's piece is in flight"
            streams[index].close()

    engine = DecodeEngine(
        CodecRunner(tiny_codec.decoder, max_streams=4),
        EngineSettings(max_batch_size=4, batch_window_s=0.005),
        on_batch=close_two_mid_batch,
    )
    await engine.start()

    async def run(index: int) -> np.ndarray | None:
        stream = streams[index]

        async def produce() -> None:
            start = 0
            for size in _growing_chunks(num_frames):
                await stream.send(codes[index][start : start + size])
                start += size
                await asyncio.sleep(0.002 * index)  # streams at different points: batches mix chunk lengths
            stream.end_input()

        producer = asyncio.create_task(produce())
        try:
            pieces = [piece.waveform async for piece in stream]
        except StreamEnded:
            return None
        finally:
            producer.cancel()
        return np.concatenate(pieces)

    try:
        for index in range(4):
            streams[index] = engine.open_stream(f"s{index}")
        first = [asyncio.create_task(run(index)) for index in range(4)]
        while not closed_slots:
            await asyncio.sleep(0.005)
        for index in (4, 5):
            streams[index] = engine.open_stream(f"n{index}")
        assert sorted(streams[index]._record.slot for index in (4, 5)) == sorted(closed_slots)
        results = await asyncio.gather(*first, *(run(index) for index in (4, 5)))
    finally:
        await engine.stop()
    assert results[1] is None and results[2] is None
    for index in (0, 3, 4, 5):
        expected = _one_shot(tiny_codec.decoder, torch.from_numpy(codes[index])[None])
        assert results[index].shape == expected.shape, index
        assert np.abs(results[index] - expected).max() <= 1e-5, index


async def test_the_batching_window_waits_only_for_streams_that_could_join(tiny_codec):
    """A lone stream's chunk is decoded at once; with another stream open and idle, the window waits for it."""
    window_s = 1.0
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=4), EngineSettings(batch_window_s=window_s))
    await engine.start()
    codes = random_codes(1, 2)[0].numpy()
    try:
        for num_idle in (0, 1):
            idle = [engine.open_stream(f"idle-{num_idle}-{i}") for i in range(num_idle)]
            async with engine.open_stream(f"lone-{num_idle}") as stream:
                started = asyncio.get_running_loop().time()
                await stream.send(codes)
                await anext(stream)
                waited_s = asyncio.get_running_loop().time() - started
            for other in idle:
                other.close()
            if num_idle:
                assert waited_s >= window_s, "the window did not wait for the idle stream"
            else:
                assert waited_s < window_s / 2, f"a lone stream waited {waited_s:.2f} s"
    finally:
        await engine.stop()


async def test_streams_well_ahead_of_their_listeners_share_a_sweep(tiny_codec):
    """Two streams with seconds of audio decoded: a chunk of one waits for a sweep, due an interval after it, and so
    shares one batch with the other's, sent 30 ms later; without sweeps they decode apart. A newcomer's first chunk
    (not ahead) and a stream's last chunk (its caller waits for the end) are decoded at once."""
    codes = random_codes(60, seed=3, batch_size=3)
    interval_s = 0.5
    for sweep_interval_s, expected_sizes in ((interval_s, [2]), (0.0, [1, 1])):
        reports: list[BatchReport] = []
        settings = EngineSettings(batch_window_s=0.005, sweep_interval_s=sweep_interval_s, piece_lengths=(1, 2, 4, 25))
        engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=4), settings, on_batch=reports.append)
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            first, second = engine.open_stream("first"), engine.open_stream("second")
            for stream in (first, second):
                await _get_ahead(stream, codes[0])
            reports.clear()
            sent_at = loop.time()
            await first.send(codes[1, :4].numpy())
            await asyncio.sleep(0.03)
            await second.send(codes[2, :4].numpy())
            await anext(first)
            await anext(second)
            assert [report.batch_size for report in reports] == expected_sizes
            assert loop.time() - sent_at < interval_s + 0.25, "a sweep came late"
            if sweep_interval_s:
                async with engine.open_stream("newcomer") as newcomer:
                    started = loop.time()
                    await newcomer.send(codes[0, :1].numpy())
                    await anext(newcomer)
                    assert loop.time() - started < interval_s / 2, "a newcomer's first chunk waited for a sweep"
                started = loop.time()
                await first.send(codes[1, 4:8].numpy())
                first.end_input()
                await anext(first)
                assert loop.time() - started < interval_s / 2, "a last chunk waited for a sweep"
            first.close()
            second.close()
        finally:
            await engine.stop()


async def test_a_plan_runs_two_batches_least_lead_first_so_a_newcomer_waits_for_two_not_all(tiny_codec):
    """While a first batch is held, a stream seconds ahead of its listener and two newcomers queue pieces of 3, 2 and
    4 frames: the next plan decodes the newcomers' (no lead), the 2 before the 4, and leaves the other's queued; a
    newcomer's first frame, sent while that plan's first batch is held, goes before it too. Every piece stays exact."""
    codes = random_codes(53, seed=9, batch_size=5)
    reports: list[BatchReport] = []
    runner = CodecRunner(tiny_codec.decoder, max_streams=5)
    settings = EngineSettings(batch_window_s=0.0, sweep_interval_s=0.0, max_plan_batches=2)
    engine = DecodeEngine(runner, settings, on_batch=reports.append)
    holds: list[tuple[threading.Event, threading.Event]] = []
    await engine.start()
    try:
        ahead = engine.open_stream("ahead")
        await _get_ahead(ahead, codes[0])
        reports.clear()
        holds += _hold_decodes(runner, 2)
        starter = engine.open_stream("starter")
        await starter.send(codes[1, :1].numpy())
        assert await asyncio.to_thread(holds[0][0].wait, 10)
        two, four = engine.open_stream("two"), engine.open_stream("four")
        await ahead.send(codes[0, 50:53].numpy())
        await two.send(codes[2, :2].numpy())
        await four.send(codes[3, :4].numpy())
        holds[0][1].set()
        assert await asyncio.to_thread(holds[1][0].wait, 10)
        late = engine.open_stream("late")
        await late.send(codes[4, :1].numpy())
        holds[1][1].set()
        pieces = [await anext(stream) for stream in (starter, two, four, late, ahead)]
        assert [report.num_frames for report in reports] == [1, 2, 4, 1, 3]
        expected = [codes[1:2, :1], codes[2:3, :2], codes[3:4, :4], codes[4:5, :1]]
        for piece, stream_codes in zip(pieces[:-1], expected, strict=True):
            assert np.abs(piece.waveform - _one_shot(tiny_codec.decoder, stream_codes)).max() <= 1e-5
        assert np.abs(pieces[-1].waveform - _one_shot(tiny_codec.decoder, codes[0:1])[50 * 1920 :]).max() <= 1e-5
        for stream in (starter, two, four, late, ahead):
            stream.close()
    finally:
        for _, release in holds:
            release.set()
        await engine.stop()


@pytest.mark.parametrize(
    ("other_is_ahead", "order"),
    [
        (True, [1, 3, 2]),  # seconds ahead of its listener too: the ending stream first, though its lead is larger
        (False, [1, 2, 3]),  # a newcomer whose listener is about to run dry: before the ending stream
    ],
)
async def test_a_capped_plan_takes_an_ending_streams_last_piece_by_its_deadline(tiny_codec, other_is_ahead, order):
    """While another batch is held, a stream seconds ahead of its listener queues 3 frames and ends its input, and
    another stream queues 2. With one batch a plan, the ending stream's piece goes before the other's if that one is
    ahead of its listener too (the ending one's caller waits for the end, not for a listener), after it if the other
    is a newcomer about to run dry; both stay exact."""
    codes = random_codes(53, seed=6, batch_size=3)
    reports: list[BatchReport] = []
    runner = CodecRunner(tiny_codec.decoder, max_streams=3)
    settings = EngineSettings(batch_window_s=0.0, sweep_interval_s=0.0, max_plan_batches=1)
    engine = DecodeEngine(runner, settings, on_batch=reports.append)
    release = threading.Event()
    await engine.start()
    try:
        other, ending = engine.open_stream("other"), engine.open_stream("ending")
        if other_is_ahead:
            await _get_ahead(other, codes[0])
            await _get_ahead(ending, codes[1])  # decoded later: the larger lead
            heard = 50
        else:
            await _get_ahead(ending, codes[1])
            await other.send(codes[0, :1].numpy())
            await anext(other)
            heard = 1
        reports.clear()
        [(held, release)] = _hold_decodes(runner, 1)
        starter = engine.open_stream("starter")
        await starter.send(codes[2, :1].numpy())
        assert await asyncio.to_thread(held.wait, 10)
        await other.send(codes[0, heard : heard + 2].numpy())
        await ending.send(codes[1, 50:53].numpy())
        ending.end_input()
        release.set()
        last = [piece async for piece in ending]
        piece = await anext(other)
        assert [report.num_frames for report in reports] == order
        other_audio = _one_shot(tiny_codec.decoder, codes[0:1, : heard + 2])[heard * 1920 :]
        assert np.abs(piece.waveform - other_audio).max() <= 1e-5
        ending_audio = _one_shot(tiny_codec.decoder, codes[1:2, :53])[50 * 1920 :]
        assert np.abs(np.concatenate([p.waveform for p in last]) - ending_audio).max() <= 1e-5
        for stream in (other, starter):
            stream.close()
    finally:
        release.set()
        await engine.stop()


async def test_a_failure_outside_a_decode_fails_the_streams_and_the_engine_runs_on(tiny_codec, caplog):
    """A bug in planning (raised once here) fails the open stream with that error, logged with its request id,
    instead of ending the engine's task (every later stream was refused while health said SERVING); the next
    stream decodes exactly."""
    codes = random_codes(2, seed=13, batch_size=2)
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=2), EngineSettings(batch_window_s=0.0))
    plan, failures = engine._plan_batches, [RuntimeError("a planning bug")]

    def plan_failing_once():
        if failures:
            raise failures.pop()
        return plan()

    engine._plan_batches = plan_failing_once
    await engine.start()
    try:
        with caplog.at_level(logging.ERROR, logger="chorus.vocoder.engine.engine"):
            async with engine.open_stream("unlucky") as unlucky:
                await unlucky.send(codes[0].numpy())
                with pytest.raises(StreamEnded) as ended:
                    await asyncio.wait_for(anext(unlucky), 10)
        assert str(ended.value.__cause__) == "a planning bug"
        assert "unlucky" in caplog.text and "a planning bug" in caplog.text
        async with engine.open_stream("next") as stream:
            await stream.send(codes[1].numpy())
            stream.end_input()
            audio = np.concatenate([piece.waveform async for piece in stream])
        assert np.abs(audio - _one_shot(tiny_codec.decoder, codes[1:2])).max() <= 1e-5
    finally:
        await engine.stop()


async def test_a_batch_reports_how_long_an_ending_stream_waited_and_when_its_last_audio_came(tiny_codec):
    """A stream ends its input with 3 frames queued while another stream's batch is held 50 ms: the batch that
    decodes them reports its wait since that end (at least the hold) and its end-to-last-audio time (no less); the
    batches before report neither, and a stream that ends with nothing to decode reports none."""
    codes = random_codes(4, seed=8, batch_size=3)
    reports: list[BatchReport] = []
    runner = CodecRunner(tiny_codec.decoder, max_streams=3)
    engine = DecodeEngine(runner, EngineSettings(batch_window_s=0.0, sweep_interval_s=0.0), on_batch=reports.append)
    release = threading.Event()
    await engine.start()
    try:
        ending, idle = engine.open_stream("ending"), engine.open_stream("idle")
        await idle.send(codes[2, :1].numpy())
        await anext(idle)
        idle.end_input()
        [(held, release)] = _hold_decodes(runner, 1)
        starter = engine.open_stream("starter")
        await starter.send(codes[1, :1].numpy())
        assert await asyncio.to_thread(held.wait, 10)
        await ending.send(codes[0, :3].numpy())
        ending.end_input()
        await asyncio.sleep(0.05)
        release.set()
        assert len([piece async for piece in ending]) == 1
        assert [(report.num_frames, len(report.end_waits_s), len(report.end_tails_s)) for report in reports] == [
            (1, 0, 0),  # idle's, before its end
            (1, 0, 0),  # starter's, held
            (3, 1, 1),
        ]
        [wait_s], [tail_s] = reports[-1].end_waits_s, reports[-1].end_tails_s
        assert 0.05 <= wait_s <= tail_s < 5
        starter.close()
    finally:
        release.set()
        await engine.stop()


@pytest.mark.parametrize(
    ("chunks", "order"),
    [
        ([(50, 53), (53, 55)], [3, 2, 1]),  # its second piece next, in a batch of its own
        # five pieces: its first and, back to back, two more (max_plan_batches rounds), then the newcomer's
        ([(50, 53), (53, 55), (55, 57), (57, 59), (59, 61)], [3, 2, 2, 1, 2, 2]),
    ],
)
async def test_an_ending_streams_last_pieces_decode_back_to_back_before_a_newcomers(tiny_codec, chunks, order):
    """A stream ahead of its listener queues pieces of 3 and 2 frames, then its input ends; while the 3 decode, a
    newcomer sends a frame: the ending stream's next pieces go first, up to `max_plan_batches` of them, and stay
    exact."""
    codes = random_codes(61, seed=5, batch_size=2)
    reports: list[BatchReport] = []
    runner = CodecRunner(tiny_codec.decoder, max_streams=2)
    settings = EngineSettings(batch_window_s=0.0, sweep_interval_s=5.0, max_plan_batches=2)  # no sweep comes
    engine = DecodeEngine(runner, settings, on_batch=reports.append)
    release = threading.Event()
    await engine.start()
    try:
        ending = engine.open_stream("ending")
        await _get_ahead(ending, codes[0])
        reports.clear()
        for start, stop in chunks:
            await ending.send(codes[0, start:stop].numpy())
        [(held, release)] = _hold_decodes(runner, 1)
        ending.end_input()
        assert await asyncio.to_thread(held.wait, 10)
        newcomer = engine.open_stream("newcomer")
        await newcomer.send(codes[1, :1].numpy())
        release.set()
        pieces = [piece async for piece in ending]
        await anext(newcomer)
        assert [report.num_frames for report in reports] == order
        audio = np.concatenate([piece.waveform for piece in pieces])
        one_shot = _one_shot(tiny_codec.decoder, codes[0:1, : chunks[-1][1]])
        assert np.abs(audio - one_shot[50 * 1920 :]).max() <= 1e-5
        newcomer.close()
    finally:
        release.set()
        await engine.stop()


async def test_a_sweep_cut_short_by_the_plan_cap_goes_on_at_once(tiny_codec):
    """Two streams ahead of their listeners queue pieces of 2 and 4 frames: one sweep, two batches; with one batch a
    plan, the second follows the first at once rather than a sweep interval later."""
    codes = random_codes(54, seed=4, batch_size=2)
    interval_s = 0.5
    reports: list[BatchReport] = []
    settings = EngineSettings(batch_window_s=0.0, sweep_interval_s=interval_s, max_plan_batches=1)
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=2), settings, on_batch=reports.append)
    await engine.start()
    loop = asyncio.get_running_loop()
    try:
        streams = [engine.open_stream(f"s{index}") for index in range(2)]
        for stream, stream_codes in zip(streams, codes, strict=True):
            await _get_ahead(stream, stream_codes)
        reports.clear()
        await streams[0].send(codes[0, 50:52].numpy())
        await streams[1].send(codes[1, 50:54].numpy())
        await anext(streams[0])
        first_at = loop.time()
        await anext(streams[1])
        assert [report.num_frames for report in reports] == [2, 4]
        assert loop.time() - first_at < interval_s / 2, "the rest of the sweep waited for the next one"
        for stream in streams:
            stream.close()
    finally:
        await engine.stop()


@pytest.mark.parametrize(
    ("urgent", "ahead", "counts"),
    [
        (0, 70, [64, 4]),  # the 2 left over wait for the next sweep
        (3, 10, [8]),  # the urgent ones, then as many ahead as fill a size
        (5, 1, [6]),  # urgent ones that need a batch padded up take the others into its padding
        (70, 0, [64, 6]),  # every urgent piece goes
        (0, 0, []),
    ],
)
def test_a_sweep_takes_as_many_pieces_as_fill_whole_batch_sizes(urgent, ahead, counts):
    settings = EngineSettings(max_batch_size=64, batch_sizes=(1, 2, 4, 8, 16, 32, 64))
    assert batch_counts(urgent, ahead, settings) == counts


@pytest.mark.parametrize(
    ("urgent", "ahead", "counts"),
    [
        (3, 10, [4]),  # the urgent ones' batch padded up to 4 rows: one ahead fills it
        (5, 1, [6]),  # too few ahead to fill the padding: what there is
        (4, 10, [4]),  # no padding: the ahead ones wait for a sweep
        (70, 5, [64, 8]),  # the last batch's padding
        (0, 70, []),
    ],
)
def test_outside_a_sweep_pieces_ahead_only_fill_the_urgent_ones_padding(urgent, ahead, counts):
    settings = EngineSettings(max_batch_size=64, batch_sizes=(1, 2, 4, 8, 16, 32, 64))
    assert batch_counts(urgent, ahead, settings, is_sweep=False) == counts


def test_where_any_batch_size_goes_no_piece_ahead_joins_outside_a_sweep():
    assert batch_counts(3, 70, EngineSettings(max_batch_size=64), is_sweep=False) == [3]


def test_where_any_batch_size_goes_a_sweep_takes_every_piece():
    assert batch_counts(3, 70, EngineSettings(max_batch_size=64)) == [64, 9]


async def test_a_sweep_leaves_the_streams_beyond_a_whole_batch_size_to_the_next(tiny_codec):
    """Three streams ahead of their listeners, batch sizes 1, 2 and 4: a sweep decodes two of their chunks together
    rather than three in a batch padded to four, and the next sweep the third."""
    codes = random_codes(54, seed=5, batch_size=3)
    interval_s = 0.2
    reports: list[BatchReport] = []
    settings = EngineSettings(batch_window_s=0.0, sweep_interval_s=interval_s, batch_sizes=(1, 2, 4))
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=4), settings, on_batch=reports.append)
    await engine.start()
    try:
        streams = [engine.open_stream(f"s{index}") for index in range(3)]
        for stream, stream_codes in zip(streams, codes, strict=True):
            await _get_ahead(stream, stream_codes)
        reports.clear()
        for stream, stream_codes in zip(streams, codes, strict=True):
            await stream.send(stream_codes[50:].numpy())
        for stream in streams:
            assert (await anext(stream)).num_frames == 4
        assert [(report.batch_size, report.num_rows) for report in reports] == [(2, 2), (1, 1)]
        for stream in streams:
            stream.close()
    finally:
        await engine.stop()


async def test_a_stream_ahead_of_its_listener_fills_a_newcomers_padded_batch_instead_of_waiting_for_a_sweep(
    tiny_codec,
):
    """Batch sizes 1, 2 and 4, sweeps 5 s apart: three newcomers' first pieces need a batch of four rows, and a
    stream seconds ahead of its listener, with a piece of the same length queued, takes the fourth row at once
    rather than leaving it idle and waiting for the sweep. Every stream's audio stays exact."""
    codes = random_codes(54, seed=11, batch_size=4)
    reports: list[BatchReport] = []
    settings = EngineSettings(batch_window_s=0.005, sweep_interval_s=5.0, batch_sizes=(1, 2, 4))
    engine = DecodeEngine(CodecRunner(tiny_codec.decoder, max_streams=4), settings, on_batch=reports.append)
    await engine.start()
    loop = asyncio.get_running_loop()
    try:
        ahead = engine.open_stream("ahead")
        await _get_ahead(ahead, codes[0])
        newcomers = [engine.open_stream(f"newcomer{index}") for index in range(3)]
        reports.clear()
        started = loop.time()
        await ahead.send(codes[0, 50:52].numpy())
        for newcomer, newcomer_codes in zip(newcomers, codes[1:], strict=True):
            await newcomer.send(newcomer_codes[:2].numpy())
        pieces = [await anext(stream) for stream in (ahead, *newcomers)]
        assert loop.time() - started < 2.0, "the stream ahead waited for the sweep"
        assert [(report.batch_size, report.num_rows) for report in reports] == [(4, 4)]
        decoder = tiny_codec.decoder
        ahead_audio = _one_shot(decoder, codes[:1, :52])[50 * decoder.samples_per_frame :]
        assert np.abs(pieces[0].waveform - ahead_audio).max() <= 1e-5
        for piece, newcomer_codes in zip(pieces[1:], codes[1:], strict=True):
            assert np.abs(piece.waveform - _one_shot(decoder, newcomer_codes[None, :2])).max() <= 1e-5
        for stream in (ahead, *newcomers):
            stream.close()
    finally:
        await engine.stop()


async def test_stats_read_from_another_thread_while_streams_open_and_end(engine):
    """The /metrics server reads the engine's gauges from its own thread while the event loop opens and ends streams
    (a stats() that walked the live streams raised "dictionary changed size during iteration" there, under load)."""
    errors, stop = [], threading.Event()

    def scrape():
        while not stop.is_set():
            try:
                engine.stats()
            except RuntimeError as error:
                errors.append(error)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython can, to meet the race in a bounded time
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not errors:
            async with engine.open_stream("r") as stream:
                stream.end_input()
                async for _ in stream:
                    pass
    finally:
        stop.set()
        scraper.join()
        sys.setswitchinterval(interval)
    assert not errors

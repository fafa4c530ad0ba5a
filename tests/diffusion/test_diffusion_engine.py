"""The batched engine on the tiny model: batch-composition independence, mixed step counts, progress,
cancellation, deadlines."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from chorus.diffusion.engine.engine import DiffusionEngine
from chorus.diffusion.engine.request import AudioOutput, Finished, FinishReason, StepProgress, validate_request


@pytest.fixture
def make_engine(tiny_models):
    engines = []

    def make(**kwargs) -> DiffusionEngine:
        engine = DiffusionEngine(tiny_models, **kwargs)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def _request(engine, request_id, **params):
    params = {"prompt": "a dog barks", "duration_s": 0.3, "num_steps": 6, "seed": 1, **params}
    return validate_request(engine.limits, request_id=request_id, **params)


async def _collect(engine, request):
    return [event async for event in engine.generate(request)]


def _audio(events):
    return [e.waveform for e in events if isinstance(e, AudioOutput)]


REQUESTS = {
    "a": {"prompt": "a dog barks", "seed": 5},
    "b": {
        "prompt": "Rain on a tin roof",
        "negative_prompt": "hiss",
        "guidance_scale": 3.0,
        "seed": 9,
        "duration_s": 0.6,
        "num_steps": 3,
    },
    "c": {"prompt": "a bell", "guidance_scale": 1.0, "seed": 2, "start_s": 0.1, "num_steps": 9},
    "d": {"prompt": "two outputs", "num_outputs": 2, "seed": 7, "num_steps": 4},
}


async def test_audio_does_not_depend_on_batch_composition(make_engine):
    alone_engine = make_engine(max_batch_size=8, batch_window_ms=0)
    alone = {}
    for name, params in REQUESTS.items():
        alone[name] = _audio(await _collect(alone_engine, _request(alone_engine, name, **params)))

    steps = []
    batched_engine = make_engine(max_batch_size=8, batch_window_ms=300, on_step=steps.append)
    names = list(REQUESTS)
    results = await asyncio.gather(
        *(_collect(batched_engine, _request(batched_engine, name, **REQUESTS[name])) for name in reversed(names))
    )
    batched = {name: _audio(events) for name, events in zip(reversed(names), results, strict=True)}
    assert steps[0].num_requests == len(REQUESTS) and steps[0].num_samples == 5
    for name in names:
        assert len(batched[name]) == len(alone[name]) == REQUESTS[name].get("num_outputs", 1)
        for together, single in zip(batched[name], alone[name], strict=True):
            torch.testing.assert_close(together, single, rtol=1e-4, atol=1e-5 * float(single.abs().max()))
    # Different seeds or prompts give different audio, so the comparison above can fail.
    assert not torch.allclose(batched["d"][0], batched["d"][1])


async def test_requests_sent_together_share_a_batch_without_a_window(make_engine):
    steps = []
    engine = make_engine(max_batch_size=8, on_step=steps.append)  # the default: no batching window
    names = [f"r{i}" for i in range(8)]
    await asyncio.gather(*(_collect(engine, _request(engine, name, seed=i)) for i, name in enumerate(names)))
    # The first may start alone; the rest join it at its next step rather than waiting for it to finish.
    assert max(step.num_requests for step in steps) == 8


async def test_mixed_step_counts_progress_and_lengths(make_engine):
    engine = make_engine(max_batch_size=4, batch_window_ms=300)
    short = _request(engine, "short", num_steps=2, duration_s=0.2)
    long = _request(engine, "long", num_steps=12, duration_s=0.5)
    finish_order = []

    async def run(request):
        events = await _collect(engine, request)
        finish_order.append(request.request_id)
        return events

    short_events, long_events = await asyncio.gather(run(short), run(long))
    assert finish_order == ["short", "long"]
    for request, events in ((short, short_events), (long, long_events)):
        progress = [e for e in events if isinstance(e, StepProgress)]
        expected = [(step, request.num_steps) for step in range(1, request.num_steps + 1)]
        assert [(p.step, p.num_steps) for p in progress] == expected
        (waveform,) = _audio(events)
        assert waveform.shape == (2, int(request.duration_s * 44100))
        (audio,) = [e for e in events if isinstance(e, AudioOutput)]
        interleaved = np.frombuffer(audio.interleaved_bytes(), dtype="<f4").reshape(-1, 2)
        assert audio.sample_rate_hz == 44100 and np.array_equal(interleaved.T, waveform.numpy())
        assert bool(waveform.isfinite().all())
        final = events[-1]
        assert isinstance(final, Finished) and final.reason is FinishReason.COMPLETE
        assert final.num_steps_run == request.num_steps and final.audio_s == pytest.approx(request.duration_s)
        assert final.num_prompt_tokens > 0


async def test_cancellation_frees_the_slot(make_engine):
    engine = make_engine(max_batch_size=1, batch_window_ms=0)
    slow = _request(engine, "slow", num_steps=1000)
    waiting = _request(engine, "waiting", num_steps=2)
    slow_events = engine.generate(slow)
    first = await anext(slow_events)
    assert isinstance(first, StepProgress)
    waiting_task = asyncio.create_task(_collect(engine, waiting))
    deadline_s = time.monotonic() + 10  # the queued request arrives within a loop turn, unless the CPU is busy
    while engine.load().queue_depth == 0 and time.monotonic() < deadline_s:
        await asyncio.sleep(0.01)
    assert engine.load().queue_depth == 1 and engine.load().num_free_slots == 0

    assert engine.abort("slow")
    rest = [event async for event in slow_events]
    assert isinstance(rest[-1], Finished) and rest[-1].reason is FinishReason.CANCELLED
    assert rest[-1].num_steps_run < 1000 and not _audio(rest)
    waiting_events = await asyncio.wait_for(waiting_task, timeout=30)
    assert waiting_events[-1].reason is FinishReason.COMPLETE
    assert engine.load().num_free_slots == 1 and not engine.abort("slow")


async def test_leaving_the_stream_cancels(make_engine):
    engine = make_engine(max_batch_size=1, batch_window_ms=0)
    stream = engine.generate(_request(engine, "gone", num_steps=1000))
    await anext(stream)
    await stream.aclose()
    deadline_s = time.monotonic() + 10
    while engine.load().num_live_requests and time.monotonic() < deadline_s:
        await asyncio.sleep(0.01)
    assert engine.load().num_live_requests == 0


async def test_deadline_ends_the_request(make_engine):
    engine = make_engine(max_batch_size=2, batch_window_ms=0)
    request = _request(engine, "late", num_steps=1000, deadline_s=time.monotonic() + 0.3)
    events = await asyncio.wait_for(_collect(engine, request), timeout=30)
    final = events[-1]
    assert final.reason is FinishReason.ERROR and final.error_code == "DEADLINE_EXCEEDED"
    assert final.num_steps_run < 1000 and not _audio(events)
    assert engine.load().num_live_requests == 0


async def test_duplicate_request_id_is_rejected(make_engine):
    engine = make_engine(max_batch_size=1, batch_window_ms=0)
    stream = engine.generate(_request(engine, "same", num_steps=1000))
    await anext(stream)
    with pytest.raises(ValueError, match="request_id"):
        engine.submit(_request(engine, "same"))
    await stream.aclose()


async def test_late_request_joins_the_running_batch_and_leaves_first(make_engine):
    steps = []
    engine = make_engine(max_batch_size=4, batch_window_ms=0, on_step=steps.append)
    long_stream = engine.generate(_request(engine, "long", num_steps=1000))
    while (await anext(long_stream)).step < 3:
        pass
    short = _audio(await _collect(engine, _request(engine, "short", num_steps=3, seed=4, prompt="a bell")))
    assert engine.load().num_live_requests == 1, "the short request finished while the long one kept running"
    assert max(step.num_samples for step in steps) == 2
    engine.abort("long")
    assert [e async for e in long_stream][-1].reason is FinishReason.CANCELLED
    alone = _audio(await _collect(engine, _request(engine, "alone", num_steps=3, seed=4, prompt="a bell")))
    torch.testing.assert_close(short[0], alone[0], rtol=1e-4, atol=1e-5 * float(alone[0].abs().max()))

"""Engine behaviour on CPU with the tiny talker: batching independence, cancellation, streaming text,
max-frames stop, slow-consumer isolation, bad requests, asyncio use."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import torch

from chorus.talker import sampling
from chorus.talker.engine.engine import EngineConfig, EngineFullError, TalkerEngine
from chorus.talker.engine.request import FinishReason
from chorus.talker.prompt import PromptError
from chorus.talker.sampling import SamplingParams

SAMPLED = SamplingParams(seed=11)
GREEDY = SamplingParams(do_sample=False, subtalker_do_sample=False)


def _engine(loaded, **overrides) -> TalkerEngine:
    settings = dict(max_streams=8, max_positions=160, max_frames=100, max_buffered_frames=100, use_cuda_graphs=False)
    return TalkerEngine(loaded, EngineConfig(**settings | overrides))


def _voice(engine, text="Hello world, this is a test.", **kwargs):
    return engine.voice_request(**({"mode": "custom_voice", "speaker": "ryan", "text": text} | kwargs))


def _run(engine, requests):
    streams = [
        engine.submit(name, voice, sampling, max_frames=max_frames) for name, voice, sampling, max_frames in requests
    ]
    engine.run_until_idle()
    return [stream.collect() for stream in streams], streams


def test_seeded_request_gives_the_same_codes_alone_and_in_any_batch(tiny_loaded):
    engine = _engine(tiny_loaded)
    target = ("target", _voice(engine), SamplingParams(seed=1234), 20)
    (alone,), (stream,) = _run(engine, [target])
    assert len(alone) >= 3 and stream.finish_reason in (FinishReason.EOS, FinishReason.MAX_LENGTH)
    others = [
        ("a", _voice(engine, "Another sentence to read.", speaker="vivian"), SamplingParams(seed=1), 20),
        (
            "b",
            _voice(engine, "Streaming text arrives.", mode="voice_design", speaker=None, instructions="Speak slowly"),
            SamplingParams(seed=2),
            20,
        ),
        ("c", _voice(engine, "Numbers like 12.5 Hz."), GREEDY, 20),
    ]
    batched, _ = _run(engine, [*others[:2], ("target", *target[1:]), others[2]])
    np.testing.assert_array_equal(batched[2], alone)
    # A different seed gives different audio, so the equality above is not vacuous.
    (reseeded,), _ = _run(engine, [("target", target[1], SamplingParams(seed=99), 20)])
    assert reseeded.shape != alone.shape or not np.array_equal(reseeded, alone)


def test_the_selecting_and_sorting_samplers_draw_the_same_codes(tiny_loaded, monkeypatch):
    # Alone, a request with the released sampling defaults steps through the selecting sampler; while a top-p
    # request shares its steps, every step sorts. Its codes must not change.
    bounds = []
    warp = sampling.warp
    monkeypatch.setattr(sampling, "warp", lambda *args: bounds.append(args[2]) or warp(*args))
    engine = _engine(tiny_loaded)

    def codes(*requests):
        streams = [engine.submit(name, _voice(engine, text), params, max_frames=30, ignore_eos=True)
                   for name, text, params in requests]  # fmt: skip
        engine.run_until_idle()
        return [stream.collect() for stream in streams]

    target = ("target", "Hello world, this is a test.", SamplingParams(seed=1234))
    nucleus = ("nucleus", "Another sentence.", SamplingParams(seed=5, top_p=0.8, subtalker_top_k=0))
    (alone,) = codes(target)
    assert set(bounds) >= {sampling.FAST_TOP_K}, "the default request's steps select"
    bounds.clear()
    beside, _ = codes(target, nucleus)
    assert set(bounds) == {0}, "every step beside the top-p request sorts"
    np.testing.assert_array_equal(beside, alone)


def test_max_frames_stops_with_max_length(tiny_loaded):
    engine = _engine(tiny_loaded)
    (frames,), (stream,) = _run(engine, [("r", _voice(engine), GREEDY, 3)])
    assert frames.shape == (3, 16) and stream.finish_reason is FinishReason.MAX_LENGTH
    assert frames.dtype == np.int16 and frames.min() >= 0 and frames.max() < 2048


def test_ignore_eos_runs_to_max_frames(tiny_loaded):
    engine = _engine(tiny_loaded)
    stream = engine.submit("r", _voice(engine), SAMPLED, max_frames=24, ignore_eos=True)
    engine.run_until_idle()
    assert stream.collect().shape == (24, 16) and stream.finish_reason is FinishReason.MAX_LENGTH


def test_cancel_mid_stream_frees_the_slot(tiny_loaded):
    engine = _engine(tiny_loaded, max_streams=1)
    engine.start()
    try:
        stream = engine.submit("long", _voice(engine), SAMPLED, max_frames=100, ignore_eos=True)
        first = stream.read_blocking(2, 2, timeout_s=30)
        assert first.shape == (2, 16)
        assert engine.load().free_slots == 0
        engine.abort("long")
        while stream.read_blocking(timeout_s=30) is not None:
            pass
        assert stream.finish_reason is FinishReason.CANCELLED
        assert engine.load().free_slots == 1
        # The freed slot serves the next request at once.
        follow_up = engine.submit("next", _voice(engine), GREEDY, max_frames=4)
        assert follow_up.collect(timeout_s=30).shape == (4, 16)
    finally:
        engine.stop()


def test_streaming_text_waits_for_text_and_matches_whole_text(tiny_loaded):
    engine = _engine(tiny_loaded)
    whole = engine.voice_request(
        "custom_voice", "Hello world, streaming text arrives", speaker="ryan", non_streaming_text=False
    )
    expected_stream = engine.submit("whole", whole, GREEDY, max_frames=20, ignore_eos=True)
    engine.run_until_idle()
    expected = expected_stream.collect()

    voice = engine.voice_request("custom_voice", "", speaker="ryan", text_complete=False)
    stream = engine.submit("streamed", voice, GREEDY, max_frames=20, ignore_eos=True)
    engine.run_until_idle()
    assert engine.load().queue_depth == 1, "no text yet: the request waits instead of inventing text"
    produced = []
    for piece in ("Hello", " world,", " streaming", " text arrives"):
        engine.add_text("streamed", piece)
        engine.run_until_idle()
        while (frames := _try_read(stream)) is not None:
            produced.append(frames)
    assert not stream.finished and 0 < sum(map(len, produced)) < 20, "without end of input it waits for text"
    engine.end_text("streamed")
    engine.run_until_idle()
    produced.append(stream.collect())
    np.testing.assert_array_equal(np.concatenate(produced), expected)


def _try_read(stream):
    try:
        return stream.read_blocking(1, None, timeout_s=0.01)
    except TimeoutError:
        return None


def test_streaming_text_generation_pauses_until_text_arrives(tiny_loaded):
    engine = _engine(tiny_loaded)
    voice = engine.voice_request("custom_voice", "Hello world", speaker="ryan", text_complete=False)
    stream = engine.submit("r", voice, GREEDY, max_frames=50)
    engine.run_until_idle()
    # Prompt consumed "Hello"; one frame per further text id: " world" is one id, then it must wait.
    num_text_ids = len(voice.text_ids)
    frames = _try_read(stream)
    assert frames is not None and len(frames) == num_text_ids - 1
    engine.run_until_idle()
    assert _try_read(stream) is None and not stream.finished
    engine.end_text("r")
    engine.run_until_idle()
    assert len(stream.collect()) >= 1 and stream.finish_reason is not None


def test_slow_consumer_pauses_only_its_own_request(tiny_loaded):
    engine = _engine(tiny_loaded, max_buffered_frames=4)
    engine.start()
    try:
        slow = engine.submit("slow", _voice(engine), SAMPLED, max_frames=40, ignore_eos=True)
        fast = engine.submit("fast", _voice(engine, speaker="vivian"), SAMPLED, max_frames=40, ignore_eos=True)
        assert fast.collect(timeout_s=30).shape == (40, 16)
        assert fast.finish_reason is FinishReason.MAX_LENGTH
        time.sleep(0.05)
        assert engine.load().live_streams == 1, "the slow request is paused, not finished"
        assert slow.read_blocking(1, None, timeout_s=5).shape == (4, 16), "its buffer is bounded"
        assert slow.collect(timeout_s=30).shape == (36, 16)
    finally:
        engine.stop()


def test_asyncio_consumer_reads_chunks(tiny_loaded):
    engine = _engine(tiny_loaded)
    engine.start()

    async def consume():
        stream = engine.submit("r", _voice(engine), SAMPLED, max_frames=12, ignore_eos=True)
        first = await stream.read(1, 1)
        chunks = [first]
        while (chunk := await stream.read(5, 5)) is not None:
            chunks.append(chunk)
        return [len(c) for c in chunks], stream.finish_reason

    try:
        sizes, reason = asyncio.run(asyncio.wait_for(consume(), 30))
    finally:
        engine.stop()
    assert sizes == [1, 5, 5, 1] and reason is FinishReason.MAX_LENGTH


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speaker": "nobody"}, "speaker: unknown 'nobody'; valid: aiden, dylan"),
        ({"language": "klingon"}, "language: unknown 'klingon'; valid: auto, chinese, english"),
        ({"mode": "voice_clone", "speaker": None}, "ref_audio"),
        (
            {
                "mode": "voice_clone",
                "speaker": None,
                "speaker_vector": torch.zeros(64),
                "ref_codes": torch.zeros(3, 16, dtype=torch.long),
            },
            "ref_text",
        ),
        ({"mode": "voice_clone", "speaker": None, "speaker_vector": torch.zeros(5)}, "speaker_embedding"),
        ({"mode": "sing"}, "mode: unknown 'sing'"),
        ({"text": ""}, "text: must not be empty"),
    ],
)
def test_bad_requests_name_the_field_and_valid_choices(tiny_loaded, kwargs, message):
    engine = _engine(tiny_loaded)
    with pytest.raises(PromptError, match=message.replace("(", r"\(")):
        engine.submit("r", _voice(engine, **kwargs))


def test_bad_sampling_and_limits_are_rejected(tiny_loaded):
    engine = _engine(tiny_loaded, max_streams=1, max_queue=1)
    with pytest.raises(ValueError, match="temperature"):
        engine.submit("r", _voice(engine), SamplingParams(temperature=0))
    with pytest.raises(ValueError, match="top_p"):
        engine.submit("r", _voice(engine), SamplingParams(top_p=1.5))
    with pytest.raises(ValueError, match="max_frames"):
        engine.submit("r", _voice(engine), max_frames=101)
    engine.submit("a", _voice(engine))
    with pytest.raises(ValueError, match="request_id"):
        engine.submit("a", _voice(engine))
    engine.submit("b", _voice(engine))
    with pytest.raises(EngineFullError):
        engine.submit("c", _voice(engine))
    with pytest.raises(ValueError, match="max_prefills_per_step: must be >= 1, got 0"):
        _engine(tiny_loaded, max_prefills_per_step=0)


def test_a_burst_of_admitted_requests_larger_than_the_queue_all_complete(tiny_loaded):
    # Slots + queue bound admission; all of a burst arrives in one step before any is placed in a slot.
    engine = _engine(tiny_loaded, max_streams=4, max_queue=2)
    burst = [(f"r{i}", _voice(engine), SamplingParams(seed=i), 5) for i in range(6)]
    codes, streams = _run(engine, burst)
    assert all(stream.finish_reason in (FinishReason.EOS, FinishReason.MAX_LENGTH) for stream in streams)
    assert all(len(c) >= 2 for c in codes) and engine.load().free_slots == 4


def test_too_long_prompt_ends_with_an_error(tiny_loaded):
    engine = _engine(tiny_loaded, max_positions=20)
    stream = engine.submit("r", _voice(engine, text="word " * 40))
    engine.run_until_idle()
    assert stream.collect().shape == (0, 16)
    assert stream.finish_reason is FinishReason.ERROR and "text: prompt of" in stream.error
    assert engine.load().free_slots == 8


def test_voice_clone_from_reference_audio_uses_the_speaker_encoder(tiny_loaded):
    engine = _engine(tiny_loaded)
    time_s = torch.arange(24000) / 24000
    audio = 0.5 * torch.sin(2 * torch.pi * 180 * time_s)
    from_audio = engine.voice_request("voice_clone", "Hello world", ref_audio=audio)
    from_vector = engine.voice_request("voice_clone", "Hello world", speaker_vector=engine.runner.speaker_vector(audio))
    (a, b), _ = _run(engine, [("audio", from_audio, GREEDY, 6), ("vector", from_vector, GREEDY, 6)])
    assert len(a) >= 2
    np.testing.assert_array_equal(a, b)


def test_icl_clone_from_plain_arrays(tiny_loaded):
    engine = _engine(tiny_loaded)
    codes = np.random.default_rng(0).integers(0, 2048, (4, 16))
    vector = np.random.default_rng(1).standard_normal(64).tolist()
    voice = engine.voice_request(
        "voice_clone", "Hello world", ref_text="The dog.", ref_codes=codes, speaker_vector=vector
    )
    assert voice.icl and not voice.non_streaming_text, "voice clone defaults to the streaming-text layout"
    (frames,), (stream,) = _run(engine, [("icl", voice, GREEDY, 5)])
    assert len(frames) >= 2 and stream.finish_reason in (FinishReason.EOS, FinishReason.MAX_LENGTH)


def test_aborting_neighbours_mid_step_leaves_the_other_requests_codes_unchanged(tiny_loaded):
    # max_positions past one attention length bucket (256): the long newcomer widens every row's attended length.
    engine = _engine(tiny_loaded, max_positions=640)
    specs = {
        "a": (_voice(engine), SamplingParams(seed=1, repetition_penalty=1.3)),
        "b": (_voice(engine, "Another sentence to read.", speaker="vivian"), SamplingParams(seed=2)),
        "c": (_voice(engine, "Numbers like 12.5 Hz.", mode="voice_design", speaker=None, instructions="Low"), GREEDY),
        "d": (_voice(engine, "The fourth one.", speaker="aiden", language="english"), SamplingParams(seed=4)),
        "e": (_voice(engine, "A newcomer.", speaker="serena"), SamplingParams(seed=5)),
        "f": (_voice(engine, "A long newcomer, " * 20, speaker="eric"), SamplingParams(seed=6)),
        "g": (_voice(engine, "The fifth one.", speaker="dylan"), SamplingParams(seed=7)),
    }

    def submit(name):
        voice, sampling = specs[name]
        return engine.submit(name, voice, sampling, max_frames=30, ignore_eos=True)

    undisturbed = {}
    for name in specs:
        stream = submit(name)
        engine.run_until_idle()
        undisturbed[name] = stream.collect()
    streams = {name: submit(name) for name in "abcdg"}  # slots 0-4: a batch bucket of 8 rows
    for _ in range(6):
        engine.step()
    # Every step launches one frame and collects the one before: b's frame is in flight when the abort lands.
    assert "b" in {request.request_id for request in engine._in_flight[1]}
    engine.abort("b")
    streams["e"] = submit("e")
    engine.step()
    assert engine.scheduler.running[1].request_id == "e", "the newcomer took b's slot while b's step was in flight"
    for _ in range(5):
        engine.step()
    for name in "acg":  # the batch shrinks to a bucket of 4 rows
        engine.abort(name)
    streams["f"] = submit("f")
    engine.step()
    assert engine.runner.position[0] > 256, "the long newcomer took a's slot"
    engine.run_until_idle()
    for name in "abcg":
        assert streams[name].finish_reason is FinishReason.CANCELLED
        assert 0 < len(streams[name].collect()) < 30
    for name in "def":
        np.testing.assert_array_equal(streams[name].collect(), undisturbed[name], err_msg=f"request {name}")
    assert engine.load().free_slots == 8


def test_a_step_launches_its_decode_before_the_prefills_host_work_and_the_newcomer_matches_alone(tiny_loaded):
    """The prefills' host work overlaps the decode step already on the GPU and the one just launched, so a step
    launches first; a request that arrives while another runs still gets the codes it gets alone."""
    engine = _engine(tiny_loaded)
    newcomer = ("late", _voice(engine, "A late arrival."), SamplingParams(seed=7), 12)
    (alone,), _ = _run(engine, [newcomer])
    calls = []
    for name in ("launch", "prefill"):
        original = getattr(engine.runner, name)

        def recorded(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        setattr(engine.runner, name, recorded)
    early = engine.submit("early", _voice(engine), SamplingParams(seed=3), max_frames=12)
    engine.step()  # prefills the first request: nothing to decode yet
    engine.step()
    late = engine.submit(*newcomer[:3], max_frames=newcomer[3])
    calls.clear()
    engine.step()  # decodes the first request and prefills the newcomer
    assert calls == ["launch", "prefill"], calls
    engine.run_until_idle()
    np.testing.assert_array_equal(late.collect(), alone)
    assert len(early.collect()) == 12


def test_a_first_frame_comes_two_steps_after_its_prefill_and_a_queued_one_counts_from_its_own(tiny_loaded):
    """The prefill's step, then the step that collects its first decode step: `steps_to_first_frame` is 2 for a
    request that finds a slot, counted from its own prefill for one that waited for a slot (the bench's breakdown
    tells a slow first frame that waited for more steps than this from one whose steps were longer)."""
    engine = _engine(tiny_loaded, max_streams=1)
    first = engine.submit("first", _voice(engine), SAMPLED, max_frames=5, ignore_eos=True)
    queued = engine.submit("queued", _voice(engine), SAMPLED, max_frames=5, ignore_eos=True)
    engine.run_until_idle()
    assert (first.steps_to_first_frame, queued.steps_to_first_frame) == (2, 2)
    assert queued.scheduled_step > first.scheduled_step + 5  # it waited for the slot: five frames' steps

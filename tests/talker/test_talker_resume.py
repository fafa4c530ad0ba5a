"""Fail-over: a request resumed after the first N frames of an uninterrupted run (`prefix_frames`) produces exactly
frames N.. of that run and ends for the same reason — every mode, sampled and greedy, with and without EOS, alone
and prefilled beside fresh requests, with streaming text; bad prefixes are refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.engine.request import FinishReason
from chorus.talker.prompt import PromptError
from chorus.talker.sampling import SamplingParams

MAX_FRAMES = 30
SAMPLED = SamplingParams(seed=7, repetition_penalty=1.3)
GREEDY = SamplingParams(do_sample=False, subtalker_do_sample=False, repetition_penalty=1.2)
TEXT = "Hello world, this is a test of resuming."


def _engine(loaded, **overrides) -> TalkerEngine:
    settings = dict(max_streams=8, max_positions=160, max_frames=100, max_buffered_frames=100, use_cuda_graphs=False)
    return TalkerEngine(loaded, EngineConfig(**settings | overrides))


def _voice_kwargs(mode: str, hidden_size: int) -> dict:
    """Keyword arguments of `voice_request` for each mode the tiny checkpoint serves."""
    generator = torch.Generator().manual_seed(3)
    vector = torch.randn(hidden_size, generator=generator)
    audio = 0.5 * torch.sin(2 * torch.pi * 180 * torch.arange(24000) / 24000)
    return {
        # the non-streaming layout: all text in the prompt, trailing text is padding
        "custom_voice": {"mode": "custom_voice", "speaker": "ryan", "language": "english"},
        # the streaming layout with all text known: trailing text ids run through the prefix frames
        "custom_voice_streaming": {"mode": "custom_voice", "speaker": "vivian", "non_streaming_text": False},
        "voice_design": {"mode": "voice_design", "instructions": "A calm, low voice."},
        "x_vector": {"mode": "voice_clone", "speaker_vector": vector},
        "x_vector_from_audio": {"mode": "voice_clone", "ref_audio": audio},
        "icl": {
            "mode": "voice_clone",
            "speaker_vector": vector,
            "ref_text": "The dog.",
            "ref_codes": torch.randint(0, 2048, (3, 16), generator=generator),
        },
    }[mode]


def _uninterrupted(engine, voice_kwargs, sampling, ignore_eos):
    stream = engine.submit(
        "full", engine.voice_request(text=TEXT, **voice_kwargs), sampling, MAX_FRAMES, ignore_eos=ignore_eos
    )
    engine.run_until_idle()
    return stream.collect(), stream.finish_reason


def _resumed(engine, voice_kwargs, sampling, ignore_eos, full, prefix_lengths):
    """Every continuation of `full` at once (their prefills share a batch), each → (frames, finish reason)."""
    streams = [
        engine.submit(
            f"resume-{n}",
            engine.voice_request(text=TEXT, prefix_frames=full[:n], **voice_kwargs),
            sampling,
            MAX_FRAMES,
            ignore_eos=ignore_eos,
        )
        for n in prefix_lengths
    ]
    engine.run_until_idle()
    return [(stream.collect(), stream.finish_reason) for stream in streams]


@pytest.mark.parametrize(
    ("mode", "sampling", "ignore_eos", "reason"),
    [
        # EOS sampled for frame 30 = max_frames: resumed after all 30 frames, the Final still says EOS
        ("custom_voice", SamplingParams(seed=5, repetition_penalty=1.3), False, FinishReason.EOS),
        ("custom_voice", GREEDY, False, FinishReason.MAX_LENGTH),
        ("custom_voice", SAMPLED, True, FinishReason.MAX_LENGTH),
        ("custom_voice_streaming", SAMPLED, False, FinishReason.MAX_LENGTH),
        ("custom_voice_streaming", GREEDY, False, FinishReason.EOS),
        ("voice_design", SamplingParams(seed=2, repetition_penalty=1.3), False, FinishReason.EOS),
        ("voice_design", GREEDY, True, FinishReason.MAX_LENGTH),
        ("x_vector", SAMPLED, True, FinishReason.MAX_LENGTH),
        ("x_vector_from_audio", GREEDY, False, FinishReason.EOS),
        ("icl", SAMPLED, False, FinishReason.MAX_LENGTH),
        ("icl", GREEDY, True, FinishReason.MAX_LENGTH),
    ],
)
def test_a_resumed_request_continues_exactly_where_the_uninterrupted_one_went(
    tiny_loaded, mode, sampling, ignore_eos, reason
):
    engine = _engine(tiny_loaded)
    voice_kwargs = _voice_kwargs(mode, tiny_loaded.config.talker.hidden_size)
    full, full_reason = _uninterrupted(engine, voice_kwargs, sampling, ignore_eos)
    num_frames = len(full)
    assert full_reason is reason and num_frames >= 4
    # N = the whole run: no frame left, but the Final the broken stream would have sent (EOS or the limit).
    prefix_lengths = sorted({1, 2, 3, num_frames // 2, num_frames - 1, num_frames})
    for n, (frames, resumed_reason) in zip(
        prefix_lengths, _resumed(engine, voice_kwargs, sampling, ignore_eos, full, prefix_lengths), strict=True
    ):
        np.testing.assert_array_equal(frames, full[n:], err_msg=f"resumed after {n} frames")
        assert resumed_reason is reason, f"resumed after {n} frames"
    assert engine.load().free_slots == 8


def test_a_resumed_prefill_beside_fresh_requests_changes_no_ones_codes(tiny_loaded):
    engine = _engine(tiny_loaded)
    kwargs = [_voice_kwargs(mode, 64) for mode in ("custom_voice", "icl", "custom_voice_streaming", "voice_design")]
    samplings = [SamplingParams(seed=seed, repetition_penalty=1.1) for seed in range(4)]
    alone = [
        _uninterrupted(engine, kw, sampling, ignore_eos=True)[0] for kw, sampling in zip(kwargs, samplings, strict=True)
    ]
    # One prefill batch: two resumed requests (a long prefix: the batch's longest prompt) and two fresh ones.
    streams = [
        engine.submit(
            f"r{index}",
            engine.voice_request(text=TEXT, prefix_frames=alone[index][:n] if n else None, **kwargs[index]),
            samplings[index],
            MAX_FRAMES,
            ignore_eos=True,
        )
        for index, n in enumerate((0, 25, 0, 4))
    ]
    engine.step()
    assert engine.stats.prefills == 4 + len(alone), "all four were prefilled in one step"
    engine.run_until_idle()
    for index, n in enumerate((0, 25, 0, 4)):
        np.testing.assert_array_equal(streams[index].collect(), alone[index][n:], err_msg=f"request {index}")
        assert streams[index].first_frame_index == n


def test_a_resumed_prompt_past_the_largest_prefill_bucket_prefills_alone_in_chunks(tiny_loaded):
    engine = _engine(tiny_loaded, max_positions=700)
    long_text = "A long sentence to read aloud. " * 18  # a prompt just under the largest bucket (512 positions)
    requests = [
        (long_text, _voice_kwargs("custom_voice", 64), 40),  # + 40 prefix frames: past it
        (TEXT, _voice_kwargs("icl", 64), 10),
        (TEXT, _voice_kwargs("voice_design", 64), 0),
    ]
    alone = []
    for index, (text, kwargs, _) in enumerate(requests):
        stream = engine.submit(f"a{index}", engine.voice_request(text=text, **kwargs), SAMPLED, 50, ignore_eos=True)
        engine.run_until_idle()
        alone.append(stream.collect())
    streams = [
        engine.submit(
            f"r{index}",
            engine.voice_request(text=text, prefix_frames=alone[index][:n] if n else None, **kwargs),
            SAMPLED,
            50,
            ignore_eos=True,
        )
        for index, (text, kwargs, n) in enumerate(requests)
    ]
    engine.step()
    assert 512 < int(engine.runner.position[0]) < 560, "the long one was prefilled, in a forward of its own"
    engine.run_until_idle()
    for index, (_, _, n) in enumerate(requests):
        np.testing.assert_array_equal(streams[index].collect(), alone[index][n:], err_msg=f"request {index}")


def _streamed_run(engine, name, pieces, end=True):
    """A streaming-text request fed `pieces` one step apart → its stream and voice (text ended when `end`)."""
    voice = engine.voice_request("custom_voice", pieces[0], speaker="ryan", text_complete=False)
    stream = engine.submit(name, voice, SAMPLED, MAX_FRAMES)
    engine.run_until_idle()
    for piece in pieces[1:]:
        engine.add_text(name, piece)
        engine.run_until_idle()
    if end:
        engine.end_text(name)
        engine.run_until_idle()
    return stream, voice


def test_a_resumed_streaming_text_request_waits_for_the_text_of_its_prefix(tiny_loaded):
    engine = _engine(tiny_loaded)
    pieces = ["Hi", " there,", " you."]
    full_stream, _ = _streamed_run(engine, "full", pieces)
    full, reason = full_stream.collect(), full_stream.finish_reason
    num_text_ids = full_stream.num_text_tokens
    assert len(full) > num_text_ids + 2, "frames past the text: the prefix below ends in padding steps"
    for n in (2, num_text_ids - 2, num_text_ids + 2):
        voice = engine.voice_request("custom_voice", pieces[0], speaker="ryan", text_complete=False,
                                     prefix_frames=full[:n])  # fmt: skip
        stream = engine.submit(f"resume-{n}", voice, SAMPLED, MAX_FRAMES)
        engine.run_until_idle()
        assert engine.load().live_streams == 0, "no prefill before the text of the prefix frames arrived"
        for piece in pieces[1:]:
            engine.add_text(f"resume-{n}", piece)
            engine.run_until_idle()
        engine.end_text(f"resume-{n}")
        engine.run_until_idle()
        np.testing.assert_array_equal(stream.collect(), full[n:], err_msg=f"resumed after {n} frames")
        assert stream.finish_reason is reason


def test_a_resumed_streaming_text_request_starts_once_its_prefix_text_is_there(tiny_loaded):
    engine = _engine(tiny_loaded)
    pieces = ["Hello", " world,", " streaming", " text", " arrives"]
    # Without end_text the run pauses for text after one frame per text id past the first.
    original, original_voice = _streamed_run(engine, "full", pieces, end=False)
    full = original.read_blocking(1, None, timeout_s=1)
    assert len(full) == len(original_voice.text_ids) - 1
    engine.abort("full")
    voice = engine.voice_request("custom_voice", "Hello", speaker="ryan", text_complete=False, prefix_frames=full[:2])
    stream = engine.submit("resume", voice, SAMPLED, MAX_FRAMES)
    engine.run_until_idle()
    assert engine.load().live_streams == 0
    for piece in pieces[1:]:
        engine.add_text("resume", piece)
        engine.run_until_idle()
        # Two prefix frames fed the text ids after the first: no prefill before three ids are there.
        assert engine.load().live_streams == (len(voice.text_ids) > 2)
    assert not stream.finished, "it runs, then pauses for text as the original did"
    np.testing.assert_array_equal(stream.read_blocking(1, None, timeout_s=1), full[2:])


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (np.zeros((3, 8), dtype=np.int64), r"prefix_frames: must be \[frames, 16\] codes, got \[3, 8\]"),
        (np.full((3, 16), 2048), r"prefix_frames: codes must be in 0..2047"),
        (np.full((3, 16), -1), r"prefix_frames: codes must be in 0..2047"),
        (np.zeros(16, dtype=np.int64), r"prefix_frames: must be \[frames, 16\]"),
        (np.zeros((11, 16), dtype=np.int64), r"prefix_frames: 11 frames exceed max_frames \(10\)"),
        (np.zeros((150, 16), dtype=np.int64), r"prefix_frames: the prompt's \d+ positions plus 150 frames exceed"),
    ],
)
def test_bad_prefixes_are_refused_naming_the_field(tiny_loaded, prefix, message):
    engine = _engine(tiny_loaded, max_frames=200)
    max_frames = 10 if len(prefix) == 11 else 200
    with pytest.raises(PromptError, match=message):
        engine.submit("r", engine.voice_request("custom_voice", TEXT, speaker="ryan", prefix_frames=prefix),
                      max_frames=max_frames)  # fmt: skip
    assert engine.load().queue_depth == 0


def test_resuming_a_sampled_request_needs_its_seed(tiny_loaded):
    engine = _engine(tiny_loaded)
    voice = engine.voice_request("custom_voice", TEXT, speaker="ryan", prefix_frames=np.zeros((3, 16), dtype=np.int64))
    with pytest.raises(PromptError, match="seed: resuming a sampled request"):
        engine.submit("r", voice, SamplingParams(subtalker_do_sample=True, do_sample=False))
    engine.submit("greedy", voice, SamplingParams(do_sample=False, subtalker_do_sample=False))  # no draws: no seed


def test_a_streamed_text_prefix_too_long_for_the_cache_ends_with_an_error(tiny_loaded):
    engine = _engine(tiny_loaded, max_frames=200)
    voice = engine.voice_request("custom_voice", "Hello", speaker="ryan", text_complete=False,
                                 prefix_frames=np.zeros((155, 16), dtype=np.int64))  # fmt: skip
    stream = engine.submit("r", voice, GREEDY, max_frames=200)
    engine.end_text("r")
    engine.run_until_idle()
    assert stream.collect().shape == (0, 16)
    assert stream.finish_reason is FinishReason.ERROR and "plus 155 frames exceed max_positions (160)" in stream.error
    assert engine.load().free_slots == 8

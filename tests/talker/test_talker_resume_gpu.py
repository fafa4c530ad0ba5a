"""On CUDA (prefills padded to buckets and replayed as graphs, or chunked past the largest bucket; decode steps
replayed as graphs; with and without the compiled step and its Triton kernels): a resumed request continues the
uninterrupted run exactly, and aborting neighbours mid-step changes no other request's codes (GPU only).

fp32 only: prefill and decode kernels round differently (~1e-6 relative in fp32), far below what flips a code of the
tiny model; in bf16 the gap is ~1e-2 and a resumed run, like any bf16 re-computation, may drift after some frames.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.engine.request import FinishReason
from chorus.talker.loader import TINY_CONFIG, TINY_SEED, LoadedTalker, build_random
from chorus.talker.sampling import SamplingParams

pytestmark = pytest.mark.gpu
TEXT = "Hello world, this is a test of resuming."
LONG_TEXT = "A long sentence to read aloud. " * 18  # a prompt just under the largest prefill bucket


def _engine(tiny_loaded, compile_step: bool) -> TalkerEngine:
    model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=torch.float32)
    loaded = LoadedTalker(model, tiny_loaded.tokenizer, tiny_loaded.sampling_defaults)
    config = EngineConfig(max_streams=8, max_positions=700, max_frames=64, max_buffered_frames=64,
                          use_cuda_graphs=True, compile_step=compile_step)  # fmt: skip
    engine = TalkerEngine(loaded, config)
    engine.runner.warmup()
    return engine


def _run(engine, name, text, kwargs, sampling, prefix=None):
    voice = engine.voice_request(text=text, prefix_frames=prefix, **kwargs)
    return engine.submit(name, voice, sampling, max_frames=50, ignore_eos=True)


@pytest.mark.parametrize("compile_step", [False, True])
def test_resumed_requests_continue_exactly(tiny_loaded, compile_step):
    engine = _engine(tiny_loaded, compile_step)
    generator = torch.Generator().manual_seed(3)
    icl = {"mode": "voice_clone", "speaker_vector": torch.randn(64, generator=generator), "ref_text": "The dog."}
    icl["ref_codes"] = torch.randint(0, 2048, (3, 16), generator=generator)
    greedy = SamplingParams(do_sample=False, subtalker_do_sample=False, repetition_penalty=1.2)
    cases = [
        (TEXT, {"mode": "custom_voice", "speaker": "ryan"}, SamplingParams(seed=7, repetition_penalty=1.3)),
        (TEXT, {"mode": "custom_voice", "speaker": "vivian", "non_streaming_text": False}, SamplingParams(seed=8)),
        (TEXT, icl, greedy),
        (LONG_TEXT, {"mode": "voice_design", "instructions": "Calm."}, SamplingParams(seed=9)),
    ]
    for text, kwargs, sampling in cases:
        stream = _run(engine, "full", text, kwargs, sampling)
        engine.run_until_idle()
        full = stream.collect()
        assert len(full) == 50
        # All continuations prefill in one step: bucketed together, but the long prompt's past 512 positions.
        prefix_lengths = (1, 7, 40, 49, 50)
        streams = [_run(engine, f"r{n}", text, kwargs, sampling, full[:n]) for n in prefix_lengths]
        engine.run_until_idle()
        for n, resumed in zip(prefix_lengths, streams, strict=True):
            np.testing.assert_array_equal(resumed.collect(), full[n:], err_msg=f"{kwargs['mode']}, after {n} frames")
            assert resumed.finish_reason is FinishReason.MAX_LENGTH


@pytest.mark.parametrize("compile_step", [False, True])
def test_aborting_neighbours_mid_step_changes_no_other_requests_codes(tiny_loaded, compile_step):
    engine = _engine(tiny_loaded, compile_step)
    specs = {
        name: (text, {"mode": "custom_voice", "speaker": speaker}, SamplingParams(seed=seed))
        for name, text, speaker, seed in [
            ("a", TEXT, "ryan", 1), ("b", "Another sentence.", "vivian", 2), ("c", "Numbers: 12.5 Hz.", "aiden", 3),
            ("d", "The fourth one.", "serena", 4), ("e", "A newcomer.", "eric", 5), ("f", LONG_TEXT, "dylan", 6),
        ]
    }  # fmt: skip
    undisturbed = {}
    for name, spec in specs.items():
        stream = _run(engine, name, *spec)
        engine.run_until_idle()
        undisturbed[name] = stream.collect()
    streams = {name: _run(engine, name, *specs[name]) for name in "abcd"}
    for _ in range(6):
        engine.step()
    engine.abort("b")  # its step is in flight; the newcomer takes its slot at the next step
    streams["e"] = _run(engine, "e", *specs["e"])
    for _ in range(6):
        engine.step()
    engine.abort("a")
    engine.abort("c")
    streams["f"] = _run(engine, "f", *specs["f"])  # a long prompt: the attended length of every row grows
    engine.run_until_idle()
    for name in "def":
        np.testing.assert_array_equal(streams[name].collect(), undisturbed[name], err_msg=f"request {name}")


def test_a_steps_prompts_batched_by_length_each_give_their_codes_alone(tiny_loaded, monkeypatch):
    engine = _engine(tiny_loaded, compile_step=False)
    # Costs as positions, as for the released shapes: the tiny model's replays cost their launches alone, so its
    # timed costs would rightly merge every batch.
    monkeypatch.setattr(engine.runner.padded_prefill, "cost", lambda rows, length: rows * length)
    plain = engine.runner.plain_prefill
    batches, run = [], plain.run
    monkeypatch.setattr(plain, "run", lambda slots, prompts: batches.append(len(prompts)) or run(slots, prompts))
    kwargs, sampling = {"mode": "custom_voice", "speaker": "ryan"}, SamplingParams(seed=4)
    texts = [TEXT, LONG_TEXT, "Hi."]
    streams = [_run(engine, f"together{index}", text, kwargs, sampling) for index, text in enumerate(texts)]
    engine.run_until_idle()
    assert batches == [2, 1], "the two short prompts in one replay, the long one in another"
    for text, stream in zip(texts, streams, strict=True):
        alone = _run(engine, "alone", text, kwargs, sampling)
        engine.run_until_idle()
        np.testing.assert_array_equal(stream.collect(), alone.collect())

"""A plain prefill (prompts from their ids, one replay on CUDA) leaves each slot as the general prefill (embeddings,
then the padded forward) leaves it, and its padded rows touch no other slot (CPU here, eager; the GPU tests replay
it as graphs: `test_talker_resume_gpu.py` resumes plain requests through the general path and compares codes)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from chorus.talker.engine import engine as engine_module
from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.engine.runner import TalkerRunner
from chorus.talker.prompt import VoiceRequest, build_prompt
from chorus.talker.sampling import SamplingParams

ROLE = [151644, 77091, 198]
SLOTS = [2, 0, 3]  # three prompts: a bucket of 4 rows, one padded; slots 1 and 4 stay free


def _voices() -> list[VoiceRequest]:
    return [
        VoiceRequest("custom_voice", ROLE, [11, 12, 13, 14], speaker="ryan"),
        VoiceRequest("custom_voice", ROLE, list(range(20, 90)), speaker="vivian", non_streaming_text=True),
        VoiceRequest("voice_design", ROLE, [15, 16], instruct_ids=[31, 32, 33, 34, 35], language="english"),
    ]


def _prefilled(loaded, plain: bool) -> tuple[TalkerRunner, list]:
    runner = TalkerRunner(loaded.model, num_slots=5, max_positions=256, pad_prefills=True)
    voices = _voices()
    prompts = [build_prompt(loaded.config, voice) for voice in voices]
    samplings = [SamplingParams(seed=5), SamplingParams(do_sample=False), SamplingParams(seed=7, top_p=0.8)]
    runner.set_params(SLOTS, samplings, seeds=[5, 6, 7], ignore_eos=[False] * 3)
    for slot, prompt in zip(SLOTS, prompts, strict=True):
        assert runner.kv_blocks.grow(slot, prompt.num_positions + 1)
    if plain:
        assert all(prompt.plain for prompt in prompts) and runner.plain_prefill.fits(3, 96)
        runner.plain_prefill.run(SLOTS, prompts)
    else:
        runner.prefill(SLOTS, *runner.embed_prompts(prompts, voices))
    return runner, prompts


def _state(runner: TalkerRunner) -> list[torch.Tensor]:
    rows = list(range(runner.num_slots))  # not the scratch slot
    return [t[rows] for t in (runner.last_hidden, runner.next_code0, runner.position, runner.num_generated,
                              runner.generated_mask)]  # fmt: skip


def test_a_plain_prefill_leaves_each_slot_as_the_general_prefill_does(tiny_loaded):
    general, prompts = _prefilled(tiny_loaded, plain=False)
    plain, _ = _prefilled(tiny_loaded, plain=True)
    for expected, got in zip(_state(general), _state(plain), strict=True):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    for slot, prompt in zip(SLOTS, prompts, strict=True):
        blocks = general.kv_blocks.owned(slot, prompt.num_positions)
        torch.testing.assert_close(
            plain.talker_cache[:, :, blocks], general.talker_cache[:, :, blocks], atol=1e-6, rtol=1e-6
        )
    for _ in range(6):  # and both decode the same frames from there
        position = int(general.position[SLOTS].max())
        expected, got = general.decode(SLOTS, [151671] * 3, position), plain.decode(SLOTS, [151671] * 3, position)
        for a, b in zip(expected, got, strict=True):
            np.testing.assert_array_equal(a, b)


def test_padded_rows_write_only_the_scratch_slot_and_the_spare_block(tiny_loaded):
    runner = TalkerRunner(tiny_loaded.model, num_slots=5, max_positions=256, pad_prefills=True)
    before = [t.clone() for t in _state(runner)]
    cache_before = runner.talker_cache.clone()
    voice = _voices()[0]
    prompt = build_prompt(tiny_loaded.config, voice)
    runner.set_params([4], [SamplingParams(seed=1)], seeds=[1], ignore_eos=[False])
    assert runner.kv_blocks.grow(4, prompt.num_positions + 1)
    runner.plain_prefill.run([4], [prompt])  # a bucket of one row: nothing padded
    runner.plain_prefill._upload([], [], [], 4, 128)  # then an empty batch of four rows, every row padded
    with torch.inference_mode():
        runner.plain_prefill.compute(4, 128)
    after = _state(runner)
    for slot in range(4):  # slots 0..3 untouched, slot 4 prefilled
        assert all(torch.equal(b[slot], a[slot]) for b, a in zip(before, after, strict=True))
    assert int(runner.position[4]) == prompt.num_positions
    touched = (runner.talker_cache != cache_before).flatten(3).any(-1).any(0).any(0).nonzero().flatten().tolist()
    owned = runner.kv_blocks.owned(4, prompt.num_positions)
    assert set(owned) <= set(touched) <= {0, *owned}  # slot 4's blocks, and the spare one (zeros write zeros there)


def test_only_prompts_of_ids_alone_are_plain(tiny_loaded):
    config = tiny_loaded.config
    assert all(build_prompt(config, voice).plain for voice in _voices())
    clone = VoiceRequest("voice_clone", ROLE, [11, 12], speaker_vector=torch.zeros(config.talker.hidden_size))
    resumed = VoiceRequest("custom_voice", ROLE, [11, 12], speaker="ryan", prefix_frames=torch.zeros(2, 16).long())
    assert not build_prompt(config, clone).plain and not build_prompt(config, resumed).plain


def test_a_step_prefills_short_and_long_prompts_in_separate_batches_each_as_alone(tiny_loaded, monkeypatch):
    monkeypatch.setattr(engine_module, "TalkerRunner", functools.partial(TalkerRunner, pad_prefills=True))
    engine = TalkerEngine(tiny_loaded, EngineConfig(max_streams=4, max_positions=400, use_cuda_graphs=False))
    buckets = []
    run = engine.runner.plain_prefill.run
    monkeypatch.setattr(
        engine.runner.plain_prefill, "run", lambda slots, prompts: buckets.append(len(prompts)) or run(slots, prompts)
    )
    texts = {"short": "Hello there.", "long": " ".join(["A much longer sentence, read in full."] * 12), "also": "Hi."}

    def codes(names):
        voices = {name: engine.voice_request("custom_voice", texts[name], speaker="ryan") for name in names}
        streams = [engine.submit(name, voices[name], SamplingParams(seed=3), max_frames=6) for name in names]
        engine.run_until_idle()
        return {name: stream.collect() for name, stream in zip(names, streams, strict=True)}, voices

    together, voices = codes(["short", "long", "also"])
    lengths = {name: build_prompt(tiny_loaded.config, voice).num_positions for name, voice in voices.items()}
    assert lengths["short"] <= 64 and lengths["also"] <= 64 and lengths["long"] > 128
    assert buckets == [2, 1], "the two short prompts in one batch, the long one in another"
    for name in texts:
        np.testing.assert_array_equal(together[name], codes([name])[0][name])

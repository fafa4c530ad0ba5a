"""The talker's KV cache as a shared pool of blocks: the pool's bookkeeping, and an engine whose pool is too small
for its streams preempting the newest and resuming them later with exactly the codes of a run that never waited
(CPU fp32, the tiny talker: every mode's prompt layout, sampled and greedy, streaming text)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.engine.kv_blocks import BLOCK_SIZE, SPARE_BLOCK, KVBlocks
from chorus.talker.engine.request import FinishReason
from chorus.talker.metrics import TalkerCollector
from chorus.talker.sampling import SamplingParams

MAX_POSITIONS = 3 * BLOCK_SIZE
FRAMES = 150  # with a ~20-position prompt: 3 blocks per request by its end


def test_slots_take_blocks_as_they_grow_and_give_them_back():
    blocks = KVBlocks(num_slots=3, max_positions=MAX_POSITIONS, num_blocks=5, device=torch.device("cpu"))
    assert blocks.num_free == 4 and blocks.table.tolist() == [[SPARE_BLOCK] * 3] * 3
    assert blocks.grow(0, 1) and blocks.grow(0, BLOCK_SIZE) and blocks.num_free == 3  # one block holds 64 positions
    assert blocks.grow(1, BLOCK_SIZE + 1) and blocks.owned(1, BLOCK_SIZE + 1) == [2, 3]
    assert blocks.missing(2, 2 * BLOCK_SIZE) == 2 and not blocks.grow(2, 2 * BLOCK_SIZE)  # all or nothing
    assert blocks.num_free == 1 and blocks.table[2].tolist() == [SPARE_BLOCK] * 3
    blocks.release(1)
    assert blocks.num_free == 3 and blocks.table[1].tolist() == [SPARE_BLOCK] * 3
    assert blocks.grow(2, 3 * BLOCK_SIZE) and sorted(blocks.owned(2, 3 * BLOCK_SIZE)) == [2, 3, 4]
    assert blocks.num_holders == 2
    # The device table follows the host's at upload (before each decode launch), in one copy.
    assert blocks.table.tolist() == [[SPARE_BLOCK] * 3] * 3
    blocks.upload()
    assert blocks.table.tolist() == blocks.host_table.tolist()
    assert blocks.table[0].tolist() == [1, SPARE_BLOCK, SPARE_BLOCK]
    blocks.release(0)
    assert blocks.num_holders == 1 and blocks.table[0].tolist() == [1, SPARE_BLOCK, SPARE_BLOCK]
    blocks.upload()
    assert blocks.table[0].tolist() == [SPARE_BLOCK] * 3


def test_a_pool_smaller_than_one_request_is_refused(tiny_loaded):
    with pytest.raises(ValueError, match="kv_cache_positions: must be 0 or at least max_positions"):
        TalkerEngine(tiny_loaded, EngineConfig(max_positions=MAX_POSITIONS, kv_cache_positions=100))


def _engine(loaded, kv_cache_positions: int) -> TalkerEngine:
    config = EngineConfig(
        max_streams=6,
        max_positions=MAX_POSITIONS,
        max_frames=FRAMES,
        max_buffered_frames=FRAMES,
        use_cuda_graphs=False,
        kv_cache_positions=kv_cache_positions,
    )
    return TalkerEngine(loaded, config)


def _requests(engine):
    vector = torch.randn(engine.model_config.talker.hidden_size, generator=torch.Generator().manual_seed(3))
    greedy = SamplingParams(do_sample=False, subtalker_do_sample=False, repetition_penalty=1.2)
    return [
        ("custom", {"mode": "custom_voice", "speaker": "ryan"}, SamplingParams(seed=1), True),
        ("design", {"mode": "voice_design", "instructions": "A calm voice."}, SamplingParams(seed=2), True),
        ("streaming", {"mode": "custom_voice", "speaker": "vivian", "non_streaming_text": False}, greedy, True),
        ("clone", {"mode": "voice_clone", "speaker_vector": vector}, SamplingParams(seed=4), True),
        ("eos", {"mode": "custom_voice", "speaker": "ryan"}, SamplingParams(seed=5, repetition_penalty=1.3), False),
        ("late text", {"mode": "custom_voice", "speaker": "vivian", "text_complete": False}, SamplingParams(seed=6),
         True),
    ]  # fmt: skip


def _run(engine) -> dict[str, tuple[np.ndarray, FinishReason]]:
    streams = {}
    for name, kwargs, sampling, ignore_eos in _requests(engine):
        text = "" if not kwargs.get("text_complete", True) else "Hello world, this is a test of a small cache."
        voice = engine.voice_request(text=text, **kwargs)
        streams[name] = engine.submit(name, voice, sampling, FRAMES, ignore_eos=ignore_eos)
    for _ in range(30):  # text that keeps arriving while the others run (and some are preempted)
        engine.step()
    for word in ("more", "words", "arrive", "while", "it", "speaks"):
        engine.add_text("late text", f" {word}")
        for _ in range(5):
            engine.step()
    engine.end_text("late text")
    engine.run_until_idle()
    return {name: (stream.collect(), stream.finish_reason) for name, stream in streams.items()}


def test_streams_preempted_for_kv_blocks_resume_with_the_codes_of_an_undisturbed_run(tiny_loaded):
    roomy = _engine(tiny_loaded, kv_cache_positions=0)
    expected = _run(roomy)
    assert roomy.stats.preemptions == 0
    small = _engine(tiny_loaded, kv_cache_positions=2 * MAX_POSITIONS)  # 6 blocks for 6 streams of up to 3
    got = _run(small)
    assert small.stats.preemptions >= 1, small.stats
    assert expected["eos"][1] is FinishReason.EOS
    for name, (frames, reason) in expected.items():
        assert name == "eos" or len(frames) > BLOCK_SIZE, name  # outgrew its first block: the pool was short
        np.testing.assert_array_equal(got[name][0], frames, err_msg=name)
        assert got[name][1] is reason, name
    assert small.kv_blocks.num_free == small.kv_blocks.num_blocks - 1  # every block back once all ended
    scraped = {metric.name: metric.samples[0].value for metric in TalkerCollector(small).collect()}
    assert scraped["chorus_talker_preemptions"] == small.stats.preemptions
    assert scraped["chorus_talker_kv_free_blocks"] == small.kv_blocks.num_free


def test_a_step_that_fails_after_a_preemption_ends_the_preempted_stream_too(tiny_loaded, monkeypatch):
    """A stream preempted while its last frame was on the device is queued again only when that frame is read; a
    step failing in between must end it with the error like the running ones, not leave it waiting forever."""
    engine = _engine(tiny_loaded, kv_cache_positions=2 * MAX_POSITIONS)
    streams = [
        engine.submit(str(seed), engine.voice_request("custom_voice", "Hello there.", speaker="ryan"),
                      SamplingParams(seed=seed), FRAMES, ignore_eos=True)
        for seed in range(4)
    ]  # fmt: skip
    launch = engine.runner.launch

    def launch_until_a_preemption(*args, **kwargs):
        if engine.stats.preemptions:
            monkeypatch.setattr(engine.runner, "launch", launch)  # the device is back for the steps after
            raise RuntimeError("device lost")
        return launch(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "launch", launch_until_a_preemption)
    for _ in range(2000):
        try:
            engine.step()
        except RuntimeError as error:
            engine._fail_running(error)  # what the engine thread's loop does
            break
    else:
        pytest.fail("no preemption happened")
    engine.run_until_idle()
    assert all(stream.finish_reason is not None for stream in streams)
    assert any(stream.finish_reason is FinishReason.ERROR for stream in streams)

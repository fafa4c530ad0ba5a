"""CUDA-graph replay of the decode step gives the same codes as eager execution, with and without the compiled
step; the compiled layers compute what the plain modules compute; a step's frames reach the host before its talker
half is done (GPU only)."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.engine.kv_blocks import BLOCK_SIZE
from chorus.talker.loader import TINY_CONFIG, TINY_SEED, LoadedTalker, build_random
from chorus.talker.sampling import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("compile_step", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager(tiny_loaded, dtype, compile_step):
    model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=dtype)
    loaded = LoadedTalker(model, tiny_loaded.tokenizer, tiny_loaded.sampling_defaults)
    results = {}
    for use_graphs in (False, True):
        engine = TalkerEngine(
            loaded,
            EngineConfig(
                max_streams=8,
                max_positions=512,
                max_frames=64,
                max_buffered_frames=64,
                use_cuda_graphs=use_graphs,
                compile_step=compile_step,
            ),
        )
        engine.runner.warmup()
        streams = []
        # Five rows → bucket 8, with greedy, seeded-sampled and mixed modes; the stop at different frames
        # changes the batch composition mid-run.
        for index in range(5):
            voice = engine.voice_request("custom_voice", f"Sentence number {index} to read.", speaker="ryan")
            sampling = (
                SamplingParams(seed=index) if index % 2 else SamplingParams(do_sample=False, subtalker_do_sample=False)
            )
            streams.append(engine.submit(str(index), voice, sampling, max_frames=30 + 5 * index))
        engine.run_until_idle()
        results[use_graphs] = [stream.collect() for stream in streams]
        if use_graphs:
            assert engine.runner.graphs.graphs, "the decode step was captured"
    for eager, replayed in zip(results[False], results[True], strict=True):
        np.testing.assert_array_equal(eager, replayed)


def test_compiled_layers_match_plain_modules():
    torch.manual_seed(0)
    results = []
    for compiled in (False, True):
        model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=torch.float32)
        stack = model.talker.model
        if compiled:
            stack.optimize_for_decode()
        block = stack.config
        cache = torch.zeros(block.num_hidden_layers, 2, 3, block.num_key_value_heads, 64, block.head_dim, device="cuda")
        generator = torch.Generator("cuda").manual_seed(1)
        outputs = []
        with torch.inference_mode():
            prompt = torch.randn(3, 20, block.hidden_size, device="cuda", generator=generator)
            positions = torch.arange(20, device="cuda")[None].expand(3, 20).contiguous()
            outputs.append(stack(prompt, positions, list(cache), 64))
            block_table = None
            if stack.uses_kernels(1):  # decode steps read a paged cache: row b's 64 positions in block b + 1
                cache = torch.cat([torch.zeros_like(cache[:, :, :1]), cache], dim=2)
                block_table = torch.arange(1, 4, device="cuda", dtype=torch.int32)[:, None]
            for step in range(20, 24):  # decode steps over the prefilled cache
                token = torch.randn(3, 1, block.hidden_size, device="cuda", generator=generator)
                positions = torch.full((3, 1), step, device="cuda")
                outputs.append(stack(token, positions, list(cache), 64, block_table))
        results.append(outputs)
    for plain, compiled in zip(*results, strict=True):
        torch.testing.assert_close(compiled, plain, atol=1e-4, rtol=1e-4)


def test_prefill_does_not_wait_for_the_gpu(tiny_loaded):
    """A new request's prefill only enqueues work: were it to wait for the stream (a blocking host-to-device copy),
    the GPU would idle behind every prefill while the engine thread prepares the next launch."""
    model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=torch.bfloat16)
    loaded = LoadedTalker(model, tiny_loaded.tokenizer, tiny_loaded.sampling_defaults)
    engine = TalkerEngine(loaded, EngineConfig(max_streams=8, max_positions=512, max_frames=8, use_cuda_graphs=True))
    engine.runner.warmup()
    for name in ("warm", "timed"):
        voice = engine.voice_request("custom_voice", f"The {name} request.", speaker="ryan")
        stream = engine.submit(name, voice, SamplingParams(seed=1), max_frames=8)
        if name == "warm":  # every lazy initialisation of the prefill path happens here
            engine.run_until_idle()
            continue
        torch.cuda._sleep(2_000_000_000)  # keeps the stream busy for about a second
        host_started = time.perf_counter()
        engine.step()  # the prefill alone: a request starts decoding the step after its prefill
        host_s = time.perf_counter() - host_started
        torch.cuda.synchronize()
        gpu_s = time.perf_counter() - host_started
        assert engine.stats.prefills == 2
        assert host_s < gpu_s / 4, f"the prefill took {host_s:.3f} s of host time behind {gpu_s:.3f} s of GPU work"
        engine.run_until_idle()
        assert len(stream.collect()) == 8


def test_frames_reach_the_host_before_the_talker_half_of_the_step(tiny_loaded):
    """A step's frames are handed out once the code predictor has made them, while the talker's half of the step
    (which only prepares the next frame) still runs: here it is held up for about half a second on the GPU, and the
    frames come anyway — the same frames an undisturbed request gets."""
    model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=torch.bfloat16)
    loaded = LoadedTalker(model, tiny_loaded.tokenizer, tiny_loaded.sampling_defaults)
    engine = TalkerEngine(loaded, EngineConfig(max_streams=8, max_positions=512, max_frames=8, use_cuda_graphs=True))
    engine.runner.warmup()
    runner = engine.runner

    def submit(name):
        voice = engine.voice_request("custom_voice", "The same sentence.", speaker="ryan")
        return engine.submit(name, voice, SamplingParams(seed=3), max_frames=8, ignore_eos=True)

    undisturbed = submit("undisturbed")
    engine.run_until_idle()
    halves = runner._step_halves

    def slow_talker_half(*key):
        predict, advance = halves(*key)
        return predict, lambda: (torch.cuda._sleep(1_000_000_000), advance())

    runner._step_halves = slow_talker_half
    stream = submit("slowed")
    engine.step()  # the prefill
    engine.step()  # the first frame's launch
    launch, _ = engine._in_flight
    first_frame = runner.collect_frames(launch)
    assert not launch.step_done.query(), "the frame came before the talker's half of its step was done"
    engine.run_until_idle()
    frames = stream.collect()
    assert np.array_equal(first_frame[0], frames[0])
    assert np.array_equal(frames, undisturbed.collect())


def test_defaults_on_cuda_serve_256_streams_from_a_pool_sized_by_free_memory(tiny_loaded):
    model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=torch.bfloat16)
    loaded = LoadedTalker(model, tiny_loaded.tokenizer, tiny_loaded.sampling_defaults)
    config = EngineConfig(max_streams=0, max_positions=4608, use_cuda_graphs=False)
    engine = TalkerEngine(loaded, config)
    assert engine.num_slots == 256
    # The tiny model's positions are small: half the free memory holds more than every stream could use, so the
    # pool is capped at every slot's max_positions (plus the spare block).
    assert engine.kv_blocks.num_blocks * BLOCK_SIZE == 256 * 4608 + BLOCK_SIZE
    del engine
    starved = dataclasses.replace(config, kv_memory_fraction=1e-9)
    with pytest.raises(ValueError, match="fewer than one stream's max_positions"):
        TalkerEngine(loaded, starved)

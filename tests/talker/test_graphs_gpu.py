"""CUDA-graph replay of the decode step gives the same codes as eager execution (GPU only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from chorus.talker.engine.engine import EngineConfig, TalkerEngine
from chorus.talker.loader import TINY_CONFIG, TINY_SEED, LoadedTalker, build_random
from chorus.talker.sampling import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager(tiny_loaded, dtype):
    model = build_random(TINY_CONFIG, TINY_SEED, device="cuda", dtype=dtype)
    loaded = LoadedTalker(model, tiny_loaded.tokenizer, tiny_loaded.sampling_defaults)
    results = {}
    for use_graphs in (False, True):
        engine = TalkerEngine(
            loaded,
            EngineConfig(
                max_streams=8, max_positions=512, max_frames=64, max_buffered_frames=64, use_cuda_graphs=use_graphs
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

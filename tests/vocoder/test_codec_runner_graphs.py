"""CUDA graph replay of batched chunk decodes equals eager decoding (GPU only)."""

from __future__ import annotations

import pytest
import torch
from vocoder_helpers import random_codes

from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.loader import load_codec


@pytest.mark.gpu
def test_graph_replay_equals_eager(monkeypatch):
    # fp32 convs in full fp32: channels-last, cuDNN picks TF32 kernels for some batch sizes and not others (an H200
    # gave 1e-3 between the bucket of 4 and an eager batch of 3), which is not what this test compares.
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    decoder = load_codec("tiny", device="cuda").decoder
    graphs = CodecRunner(decoder, max_streams=6, graph_batch_sizes=(1, 2, 4), graph_chunk_frames=(1, 25))
    eager = CodecRunner(decoder, max_streams=6)
    assert graphs.captured_shapes == [(b, f) for b in (1, 2, 4) for f in (1, 25)]
    streams = {slot: random_codes(76, seed=slot)[0] for slot in range(5)}
    # Batches of 1, 3 (padded to bucket 4) and 5 (over the largest bucket: eager), chunk lengths 1 and 25.
    schedule = [([0], 0, 1), ([0, 1, 2], 1, 25), ([0, 1, 2, 3, 4], 26, 25), ([1, 3], 51, 25), ([4], 51, 1)]
    seen: set[int] = set()
    for slots, start, num_frames in schedule:
        codes = torch.stack([streams[s][start : start + num_frames] for s in slots])
        fresh = [s for s in slots if s not in seen]
        seen.update(slots)
        expected = eager.decode(slots, codes, fresh)
        actual = graphs.decode(slots, codes, fresh)
        assert actual.shape == expected.shape == (len(slots), num_frames * 1920)
        assert (actual - expected).abs().max().item() <= 1e-6

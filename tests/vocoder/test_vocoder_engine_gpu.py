"""The engine as built on CUDA (graphs per captured length, fused kernels): a stream's last frames padded up to a
captured length decode to the one-shot audio (GPU only)."""

from __future__ import annotations

import pytest
import torch
from vocoder_helpers import random_codes

from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.engine.build import build_engine
from chorus.vocoder.engine.engine import BatchReport, EngineSettings


@pytest.mark.gpu
async def test_last_frames_padded_in_a_graph_equal_the_one_shot_decode(monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # fp32 means fp32 (see the graph replay test)
    reports: list[BatchReport] = []
    engine = build_engine(
        VocoderConfig(model="tiny", device="cuda", max_streams=2),
        EngineSettings(max_batch_size=2, batch_window_s=0.0),
        graph_chunk_frames=(1, 4, 16),
        on_batch=reports.append,
    )
    await engine.start()
    codes = random_codes(5 + 11, seed=4)
    try:
        async with engine.open_stream("padded") as stream:
            await stream.send(codes[0, :5].numpy())  # 4 + 1, then 11 frames padded to 16
            pieces = [await anext(stream), await anext(stream)]
            await stream.send(codes[0, 5:].numpy())
            stream.end_input()
            pieces += [piece async for piece in stream]
        with torch.inference_mode():
            expected, _ = engine.runner.decoder(codes.cuda(), engine.runner.decoder.new_state(1))
    finally:
        await engine.stop()
    assert [report.num_frames for report in reports] == [4, 1, 16]
    assert [piece.num_frames for piece in pieces] == [4, 1, 11]
    waveform = torch.cat([torch.from_numpy(piece.waveform) for piece in pieces])
    assert (waveform - expected[0].float().cpu()).abs().max().item() <= 1e-5

"""The benchmark command runs end to end (tiny model, CPU) and writes its JSON and PNG."""

from __future__ import annotations

import json

from chorus.vocoder import bench


def test_bench_writes_json_and_png(tmp_path):
    arguments = [
        "--model",
        "tiny",
        "--device",
        "cpu",
        "--streams",
        "1",
        "2",
        "--num-chunks",
        "1",
        "--precisions",
        "fp32",
        "--out",
    ]
    results = bench.main([*arguments, str(tmp_path)])
    (json_path,) = tmp_path.glob("vocoder-*.json")
    (png_path,) = tmp_path.glob("vocoder-*.png")
    assert json.loads(json_path.read_text())["precisions"]["fp32"]["streams"]["2"]["streamed_audio_s_per_s"] > 0
    assert png_path.read_bytes().startswith(b"\x89PNG")
    assert results["precisions"]["fp32"]["first_chunk_ms"] > 0

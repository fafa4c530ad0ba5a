"""The benchmark command runs end to end (tiny preset, CPU, a few steps) and writes its JSON and PNG."""

from __future__ import annotations

import json

from chorus.diffusion.bench import main


def test_bench_smoke(tmp_path):
    flags = (
        "--preset tiny --device cpu --dtype float32 --num-steps 3 --num-concurrent 2 --repeats 1 --batch-window-ms 5"
        " --attention-backend flash"
    )
    report = main([*flags.split(), "--out", str(tmp_path)])
    results = report["results"]
    for key in (
        "ours_one_request_s",
        "ours_concurrent_s",
        "pipeline_one_request_s",
        "pipeline_one_call_per_request_s",
        "pipeline_one_call_all_prompts_s",
    ):
        assert results[key] > 0
    (json_path,) = tmp_path.glob("diffusion-*.json")
    (png_path,) = tmp_path.glob("diffusion-*.png")
    settings = json.loads(json_path.read_text())["settings"]
    assert settings["num_steps"] == 3 and settings["attention_backend"] == "flash"
    assert png_path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

"""The multi-GPU benchmark runs end to end on CPU (tiny preset, gloo, a few steps) and writes JSON and PNG."""

from __future__ import annotations

import json

from chorus.diffusion.bench_multigpu import default_configurations, main


def test_default_configurations_follow_the_gpu_count():
    assert default_configurations(1) == [("none", 1)]
    assert default_configurations(2) == [("none", 1), ("cfg", 2), ("tp", 2), ("sp", 2)]
    assert ("cfg+tp", 4) in default_configurations(4) and ("tp", 4) in default_configurations(4)


def test_bench_multigpu_smoke(tmp_path, monkeypatch):
    monkeypatch.setenv("CHORUS_COMMIT", "abc123")
    flags = (
        "--preset tiny --device cpu --dtype float32 --num-steps 3 --num-concurrent 2 --quick --batch-window-ms 5"
        " --configurations none:1,cfg:2 --replicas 2"
    )
    report = main([*flags.split(), "--out", str(tmp_path)])
    rows = {(row["mode"], row["degree"]): row for row in report["results"]}
    assert set(rows) == {("none", 1), ("cfg", 2), ("replicas", 2)}
    assert all(row["concurrent_s"] > 0 for row in rows.values()) and rows[("cfg", 2)]["one_request_s"] > 0
    (json_path,) = tmp_path.glob("multigpu-*.json")
    (png_path,) = tmp_path.glob("multigpu-*.png")
    saved = json.loads(json_path.read_text())
    assert saved["commit"] == "abc123" and saved["torch"] and "gpu_count" in saved and saved["device_name"]
    assert png_path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

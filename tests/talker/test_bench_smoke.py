"""The benchmark command runs end to end on CPU with the tiny preset (numbers are meaningless here)."""

from __future__ import annotations

import json

from chorus.talker.bench import main


def test_bench_writes_json_and_png(tmp_path):
    report = main(
        [
            "--size",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--batch-sizes",
            "1,2",
            "--frames",
            "6",
            "--skip-reference",
            "--out",
            str(tmp_path),
        ]
    )
    assert [row["batch_size"] for row in report["ours"]] == [1, 2]
    assert all(row["ms_per_frame_step"] > 0 and row["audio_s_per_s"] > 0 for row in report["ours"])
    (json_path,) = tmp_path.glob("talker-*.json")
    assert json.loads(json_path.read_text())["settings"]["frames_per_request"] == 6
    (png_path,) = tmp_path.glob("talker-*.png")
    assert png_path.read_bytes().startswith(b"\x89PNG")

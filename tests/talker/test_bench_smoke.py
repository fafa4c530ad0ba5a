"""The benchmark command runs end to end on CPU with the tiny preset (numbers are meaningless here)."""

from __future__ import annotations

import json

from chorus.talker.bench import check_targets, main


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


def test_targets_are_issue_18s_and_checked_against_their_batch_size():
    ours = [
        {"batch_size": 1, "ms_per_frame_step": 3.4, "audio_s_per_s": 20.0},
        {"batch_size": 16, "ms_per_frame_step": 4.0, "audio_s_per_s": 300.0},
        {"batch_size": 64, "ms_per_frame_step": 5.5, "audio_s_per_s": 1150.0},
    ]
    checks = [(c["batch_size"], c["metric"], c["bound"], c["met"]) for c in check_targets(ours)]
    assert checks == [(1, "ms_per_frame_step", 3.5, True), (64, "audio_s_per_s", 1200.0, False)]
    assert check_targets(ours[1:2]) == []


def test_bench_loads_a_checkpoint_folder_with_voice_clone_requests(tiny_folder, tmp_path):
    """The peers' comparison: our engine on the folder they load, with the x-vector clones they run."""
    argv = ["--size", str(tiny_folder), "--device", "cpu", "--dtype", "float32", "--batch-sizes", "2", "--frames", "4",
            "--skip-reference", "--voice-clone", "--out", str(tmp_path)]  # fmt: skip
    report = main(argv)
    assert report["settings"]["requests"] == "x-vector voice clone" and report["targets"] == []
    assert report["ours"][0]["audio_s_per_s"] > 0

"""Benchmark output: progress lines while it runs, then JSON + PNG with device, commit and settings."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from chorus.bench_png import write_grouped_bars, write_stacked_bars

REPO = Path(__file__).resolve().parents[2]


class Progress:
    """A line per finished level on stderr, and a live request counter when stderr is a terminal."""

    def __init__(self, stream=sys.stderr) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def level(self, name: str, num_requests: int):
        state = {"done": 0}
        self.name = name

        def one_done() -> None:
            state["done"] += 1
            if self.live:
                print(f"\r  {name}: {state['done']}/{num_requests}", end="", file=self.stream, flush=True)

        return one_done

    def done(self, level: dict) -> None:
        end = "\n" if not self.live else "\r"
        print(f"{end}  {self.name}: " + json.dumps(level), file=self.stream, flush=True)


def checked(row: dict, path: tuple[str, ...], bound: float, kind: str) -> tuple[object, bool]:
    """The value at `path` in a result `row` and whether it meets `bound`, a "max" or a "min" (None meets none)."""
    value = row
    for key in path:
        value = value[key]
    return value, value is not None and (value <= bound if kind == "max" else value >= bound)


def commit(repo: Path = REPO) -> str:
    """The commit measured: CHORUS_COMMIT where set (the GPU machine gets a copy of the tree whose history may be
    older than the tree), else the checkout's, with `-dirty` when its tracked files differ from that commit (a
    result labelled with a commit whose code did not run would mislead)."""
    if os.environ.get("CHORUS_COMMIT"):
        return os.environ["CHORUS_COMMIT"]
    command = ["git", "describe", "--always", "--dirty", "--abbrev=7", "--exclude=*"]  # a short hash, never a tag
    completed = subprocess.run(command, cwd=repo, capture_output=True, text=True)
    return completed.stdout.strip() or "unknown"


def write(
    out: Path,
    kind: str,
    settings: dict,
    levels: list[dict],
    targets: list[dict],
    label: str,
    stacks: list[list[float]] | None = None,
) -> Path:
    """`out/e2e-<kind>-<stamp>.json` and `.png` (audio-s/s per level, beside its bound where a target has one);
    with `stacks`, `-stages.png` too (a bar per level, its parts stacked bottom-up)."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    report = {
        "benchmark": f"e2e-{kind}",
        "label": label,
        "commit": commit(),
        "host": platform.node(),
        "settings": settings,
        "levels": levels,
        "targets": targets,
    }
    path = out / f"e2e-{kind}-{stamp}.json"
    path.write_text(json.dumps(report, indent=2))
    bounds = {t["concurrency"]: t["bound"] for t in targets if t["metric"] == "audio_s_per_s"}
    write_grouped_bars(
        path.with_suffix(".png"), [(lv["audio_s_per_s"], bounds.get(lv["concurrency"], 0.0)) for lv in levels]
    )
    if stacks:
        write_stacked_bars(path.with_name(f"{path.stem}-stages.png"), stacks)
    return path

"""Runs one peer engine, in its own environment, on a local checkpoint and writes `peers-<peer>-<stamp>.json`.

Usage (Chorus's Python; the peer runs as a subprocess of PYTHON, like the parity tests run qwen-tts):
  python bench/peers/run_peer.py PEER --checkpoint DIR [--python PEER_ENV/bin/python] [--device cuda]
         [--batch-sizes 1,4,16,32] [--frames 125] [--repeats 3] [--out bench/results]
  python bench/peers/run_peer.py PEER --write-tiny ...    # CPU dry run: writes the tiny checkpoint first

PEER: faster-qwen3-tts (CUDA graphs, one request at a time) or faster-qwen3-tts-batch (batched CUDA graphs).
Each has its own env (bench/peers/make_env.sh): .venv-peers (transformers 5) and .venv-peers-hf4 (transformers 4,
whose cache API the batch engine calls); PEER_ENV defaults to the peer's.
The subprocess runs with HF_HUB_OFFLINE=1 and TRANSFORMERS_OFFLINE=1, so a peer that wants the hub fails here
as it would on the offline GPU machine. Exit status 0 when the peer was timed, 3 with a one-line reason (also
in the JSON's `reason`) when it cannot load the checkpoint or run offline on this device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# Each peer's env and the make_env.sh call that builds it: the batch engine needs transformers 4 (see make_env.sh).
PEER_ENVS = {
    "faster-qwen3-tts": (".venv-peers", "bench/peers/make_env.sh"),
    "faster-qwen3-tts-batch": (".venv-peers-hf4", "bench/peers/make_env.sh --hf4"),
}
PEERS = tuple(PEER_ENVS)
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
CANNOT_RUN = 3


def commit() -> str:
    """CHORUS_COMMIT where set (the GPU machine gets the tree without its history), else this checkout's HEAD."""
    if os.environ.get("CHORUS_COMMIT"):
        return os.environ["CHORUS_COMMIT"]
    completed = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return completed.stdout.strip() or "unknown"


def describe_checkpoint(folder: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    talker = config["talker_config"]
    weights = sum(f.stat().st_size for f in folder.rglob("*.safetensors"))
    return {
        "path": str(folder),
        "tts_model_type": config["tts_model_type"],
        "tts_model_size": config["tts_model_size"],
        "talker_hidden_size": talker["hidden_size"],
        "talker_layers": talker["num_hidden_layers"],
        "weights_mib": round(weights / 2**20),
        "weights": "random (bench/peers/write_checkpoint.py)",
    }


def timed_before_the_end(log: str) -> dict:
    """The batch sizes a worker cut off by the timeout had timed (its `  batch N: {...}` lines; an H100 run of the
    batch peer timed 64 and 1 in 125 s and was still running after the last) as `batches` and `best_batch`, with
    `batches_from_log`; {} for none."""
    rows = [json.loads(line.split(": ", 1)[1]) for line in log.splitlines() if line.startswith("  batch ")]
    timed = [row for row in rows if "audio_s_per_s" in row]
    if not rows:
        return {}
    best = max(timed, key=lambda row: row["audio_s_per_s"]) if timed else None
    return {"batches": rows, "best_batch": best, "batches_from_log": True}


def run_worker(peer: str, args: argparse.Namespace, checkpoint: Path, settings: dict) -> dict:
    """The peer's Python on peer_worker.py; its JSON, or a report built from its last stderr line if it died."""
    env = os.environ | OFFLINE_ENV | {"PYTHONUNBUFFERED": "1"}
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    with tempfile.TemporaryDirectory(prefix="peer-run-") as work:
        out, log = Path(work) / "worker.json", Path(args.log or Path(work) / "worker.log")
        command = [args.python, str(HERE / "peer_worker.py"), peer, str(checkpoint), str(out), json.dumps(settings)]
        # cwd outside the checkout, so the peer cannot import anything of Chorus's by accident.
        with log.open("w") as stderr:
            try:
                completed = subprocess.run(
                    command, env=env, cwd=work, stdout=stderr, stderr=stderr, timeout=args.timeout_s
                )
            except subprocess.TimeoutExpired:
                report = {
                    "peer": peer,
                    "failed_stage": "timeout",
                    "reason": f"timeout: no result in {args.timeout_s:.0f} s",
                }
                return report | timed_before_the_end(log.read_text())
        if out.exists():
            return json.loads(out.read_text())
        last = next((line for line in reversed(log.read_text().splitlines()) if line.strip()), "no output")
        return {"peer": peer, "failed_stage": "worker", "reason": f"worker exited {completed.returncode}: {last}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("peer", choices=PEERS)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="official-layout folder (bench/peers/write_checkpoint.py)")
    source.add_argument("--write-tiny", action="store_true", help="write the tiny checkpoint to a temp dir first")
    parser.add_argument("--python", default="", help="the peer env's Python (default: PEER_ENVS[peer]/bin/python)")
    parser.add_argument("--pythonpath", default="", help="PYTHONPATH for the peer (its --target site on the GPU box)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--frames", type=int, default=125, help="codec frames per request (125 = 10 s)")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32", help="faster-qwen3-tts-batch only")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per level (median reported)")
    parser.add_argument("--probe", action="store_true", help="first load + synthesize with the peers' eager model code")
    parser.add_argument("--timeout-s", type=float, default=540.0)
    parser.add_argument("--log", default="", help="file for the worker's stderr")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    venv, builder = PEER_ENVS[args.peer]
    args.python = args.python or str(REPO / venv / "bin" / "python")
    if not Path(args.python).exists() and "/" in args.python:
        print(f"{args.peer}: cannot run: no peer environment at {args.python} ({builder} builds it)")
        return CANNOT_RUN

    settings = {
        "device": args.device,
        "dtype": args.dtype,
        "frames": args.frames,
        "batch_sizes": [int(size) for size in args.batch_sizes.split(",")] if args.peer.endswith("batch") else [1],
        "repeats": args.repeats,
        "probe": args.probe,
    }
    with tempfile.TemporaryDirectory(prefix="peer-checkpoint-") as scratch:
        checkpoint = args.checkpoint
        if args.write_tiny:
            from write_checkpoint import write_checkpoint

            checkpoint = write_checkpoint(Path(scratch) / "tiny")
        report = {
            "benchmark": f"peers-{args.peer}",
            "commit": commit(),
            "settings": settings | {"offline_env": OFFLINE_ENV, "request": "x-vector voice clone, forced length"},
            "checkpoint": describe_checkpoint(checkpoint),
        }
        started = time.perf_counter()
        report |= run_worker(args.peer, args, checkpoint, settings)
        report["elapsed_s"] = round(time.perf_counter() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"peers-{args.peer}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    for row in report.get("batches", []):
        print(f"{args.peer} batch {row['batch_size']}: {json.dumps(row)}")
    if report.get("reason"):
        print(f"{args.peer}: cannot run: {report['reason']} ({path})")
        return CANNOT_RUN
    print(f"{args.peer}: best {json.dumps(report['best_batch'])} ({path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

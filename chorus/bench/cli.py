"""The `chorus bench` command: `chorus bench tts …`, `chorus bench diffusion …`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp
import grpc
import httpx

from chorus.bench import diffusion, tts
from chorus.bench.prompts import SPEECH
from chorus.bench.report import REPO, Progress, write
from chorus.client.grpc_client import FORMATS


def _ints(text: str) -> list[int]:
    return [int(value) for value in text.split(",")]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("CHORUS_URL", "http://127.0.0.1:8000"), help="REST API")
    parser.add_argument("--api-key", default=os.environ.get("CHORUS_API_KEY"))
    parser.add_argument("--request-timeout-s", type=float, default=300.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="Stop the whole run after this long.")
    parser.add_argument("--label", default="", help="Free text stored in the JSON (e.g. the device).")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")


def register(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="Benchmark a running stack end to end (JSON + PNG results).")
    kinds = bench.add_subparsers(dest="bench_kind", required=True)

    speech = kinds.add_parser("tts", help="Streaming speech: TTFP, latency, RTF, audio-s/s, underruns.")
    _common(speech)
    speech.add_argument("--grpc-target", default=os.environ.get("CHORUS_GRPC", "127.0.0.1:50050"))
    speech.add_argument("--transport", choices=("rest", "grpc", "both"), default="both")
    speech.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64, 256])
    speech.add_argument("--requests-per-level", type=int, default=0, help="0: max(8, 2 × concurrency)")
    speech.add_argument("--prompts", type=lambda text: text.split(","), default=list(SPEECH))
    speech.add_argument("--fixed-frames", type=int, default=0, help="Every request runs to N frames (EOS ignored).")
    speech.add_argument("--model", default=None, help="Default: the first model the gateway lists.")
    speech.add_argument("--voice", default="ryan")
    speech.add_argument(
        "--format", choices=sorted(FORMATS), default="pcm",
        help="Response format (encoded audio is credited by its packets' durations).",
    )  # fmt: skip
    speech.add_argument(
        "--chaos",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="Kill (SIGKILL) a talker or vocoder replica on this machine every SECONDS, only while another replica "
        "of it is healthy; each level then reports the kills and how long its streams went without audio after one.",
    )
    speech.add_argument(
        "--no-breakdown", action="store_true",
        help="Leave out each level's step-time breakdown (talker, vocoder, CPU of the local stack's processes).",
    )  # fmt: skip
    speech.set_defaults(handler=lambda args: _main(args, "tts", tts.run, tts.check_targets))

    audio = kinds.add_parser("diffusion", help="Text-to-audio: latency and throughput at concurrency 1, 4, 8.")
    _common(audio)
    audio.add_argument("--concurrency", type=_ints, default=[1, 4, 8])
    audio.add_argument(
        "--warmup-requests", type=int, default=1,
        help="Requests run alone before the levels, reported apart (a fresh gateway process's first pays one-off "
        "costs).",
    )  # fmt: skip
    audio.add_argument("--steps", type=int, default=100)
    audio.add_argument("--guidance-scale", type=float, default=7.0)
    audio.add_argument("--duration-s", type=float, default=10.0)
    audio.add_argument("--model", default="stable-audio-open-1.0")
    audio.add_argument("--format", choices=sorted(FORMATS), default="wav", help="Response format of every request.")
    audio.set_defaults(
        handler=lambda args: _main(args, "diffusion", diffusion.run, diffusion.check_targets, diffusion.stage_stacks)
    )


def _main(args: argparse.Namespace, kind: str, run, check_targets, stacks=None) -> int:
    bad_prompts = [name for name in getattr(args, "prompts", []) if name not in SPEECH]
    if bad_prompts:
        print(f"chorus bench: unknown prompts {bad_prompts}; choose from {list(SPEECH)}", file=sys.stderr)
        return 2
    try:
        levels = asyncio.run(asyncio.wait_for(run(args, Progress()), args.timeout_s))
    except (httpx.ConnectError, aiohttp.ClientConnectionError, grpc.aio.AioRpcError) as exc:
        print(f"chorus bench: cannot reach the Chorus gateway at {args.url}: {exc}", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(f"chorus bench: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"chorus bench: stopped after --timeout-s {args.timeout_s:.0f} s", file=sys.stderr)
        return 1
    settings = {key: value for key, value in vars(args).items() if key not in ("handler", "api_key", "out")}
    targets = check_targets(levels)
    path = write(args.out, kind, settings, levels, targets, args.label, stacks(levels) if stacks else None)
    for target in targets:
        print(("met    " if target["met"] else "missed ") + json.dumps(target))
    print(f"wrote {path} and .png")
    return 0

"""`chorus bench diffusion`: text-to-audio through the gateway's synchronous REST endpoint at concurrency 1, 4
and 8 (each level sends exactly `concurrency` requests at once, as in issue 8's "8 concurrent all done")."""

from __future__ import annotations

import asyncio
import time

import httpx

from chorus.bench.prompts import AUDIO


async def one(client: httpx.AsyncClient, body: dict) -> tuple[float, str | None]:
    started = time.perf_counter()
    try:
        reply = await client.post("/v1/audio/generations", json=body)
        error = None if reply.status_code == 200 else f"HTTP {reply.status_code}"
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    return time.perf_counter() - started, error


async def run(args, progress) -> list[dict]:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    levels = []
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=args.request_timeout_s) as http:
        for concurrency in args.concurrency:
            counter = progress.level(f"diffusion c={concurrency}", concurrency)
            bodies = [
                {"model": args.model, "prompt": AUDIO[i % len(AUDIO)], "duration_s": args.duration_s,
                 "num_steps": args.steps, "guidance_scale": args.guidance_scale, "seed": i, "response_format": "wav"}
                for i in range(concurrency)
            ]  # fmt: skip
            started = time.perf_counter()

            async def timed(body, counter=counter):
                result = await one(http, body)
                counter()
                return result

            results = await asyncio.gather(*(timed(body) for body in bodies))
            wall_s = time.perf_counter() - started
            latencies = sorted(latency for latency, error in results if error is None)
            errors: dict[str, int] = {}
            for _, error in results:
                if error is not None:
                    errors[error] = errors.get(error, 0) + 1
            levels.append({
                "concurrency": concurrency, "completed": len(latencies), "errors": errors,
                "all_done_s": round(wall_s, 3),
                "latency_s": {"min": round(latencies[0], 3), "max": round(latencies[-1], 3)} if latencies else None,
                "requests_per_s": round(len(latencies) / wall_s, 3),
                "audio_s_per_s": round(len(latencies) * args.duration_s / wall_s, 2),
            })  # fmt: skip
            progress.done(levels[-1])
    return levels


def check_targets(levels: list[dict]) -> list[dict]:
    return [
        {"concurrency": 8, "metric": "all_done_s", "value": level["all_done_s"], "bound": 9.0, "kind": "max",
         "met": level["completed"] == 8 and level["all_done_s"] <= 9.0}
        for level in levels if level["concurrency"] == 8
    ]  # fmt: skip

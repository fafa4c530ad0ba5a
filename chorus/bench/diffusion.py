"""`chorus bench diffusion`: text-to-audio through the gateway's synchronous REST endpoint at concurrency 1, 4
and 8 (each level sends exactly `concurrency` requests at once, as in issue 8's "8 concurrent all done", on as
many connections opened before it: `open_connections`). First, `--warmup-requests` (default 1) requests run
alone and are reported apart (the first level's `warmup_requests`): the first request a gateway process serves
after it starts pays one-off costs (20-30 ms more on an H100: e2e-diffusion-20261127-002319, whose first level
is its warm-up, against the three after it), which would otherwise be the whole 1-request level.

Where the time goes: once a level is done, each request's record (`GET /v1/requests/{id}`, the id from the
reply's X-Request-Id) gives its timeline, ms from admission to each stage the gateway marked, and the
diffusion service's own timings. Every request in the JSON carries its timeline, its stages (`stages_ms`: time
from the previous mark to each one; `client` is the rest of the client's latency, before admission and after
the record's end) and its gateway overhead: client latency minus the service's `total_ms`. Each level has the
medians of these (`stages_ms_p50` in timeline order, which the `-stages.png` plot stacks bottom-up).
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from urllib.parse import urlsplit

import aiohttp

from chorus.bench.breakdown import Skipped, local_pids, metrics_url, parse_metrics
from chorus.bench.local_processes import is_local, listeners
from chorus.bench.prompts import AUDIO
from chorus.bench.report import checked

MIB = 2**20
PEAK_GAUGES = {
    "max_allocated": "chorus_cuda_memory_max_allocated_bytes",
    "max_reserved": "chorus_cuda_memory_max_reserved_bytes",
}


async def one(http: aiohttp.ClientSession, body: dict) -> tuple[float, str | None, str | None]:
    """(latency s, error or None, request id or None); the latency ends with the whole file read."""
    started = time.perf_counter()
    try:
        async with http.post("/v1/audio/generations", json=body) as reply:
            await reply.read()
            error = None if reply.status == 200 else f"HTTP {reply.status}"
            request_id = reply.headers.get("x-request-id")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return time.perf_counter() - started, type(exc).__name__, None
    return time.perf_counter() - started, error, request_id


async def open_connections(http: aiohttp.ClientSession, count: int) -> None:
    """Have `count` connections open before a level, as a keep-alive client (the OpenAI SDK's) has after its first
    requests: a level's requests then time the gateway, not connecting (on loopback a fresh client's first request
    took 20-40 ms more, counted as gateway overhead)."""

    async def health() -> None:
        async with http.get("/health") as reply:
            reply.raise_for_status()
            await reply.read()

    await asyncio.gather(*(health() for _ in range(count)))


async def request_record(http: aiohttp.ClientSession, request_id: str) -> dict:
    async with http.get(f"/v1/requests/{request_id}") as reply:
        reply.raise_for_status()
        return await reply.json()


def request_breakdown(latency_s: float, record: dict) -> dict:
    """One finished request: client latency, the gateway's timeline, its stages, the service's timings and the
    gateway's overhead (everything but the service's own total)."""
    timeline = record.get("timeline") or {}
    service = (record.get("usage") or {}).get("timings") or {}
    latency_ms = latency_s * 1000
    pairs = itertools.pairwise(timeline.items())
    stages = {name.removesuffix("_ms"): at_ms - before_ms for (_, before_ms), (name, at_ms) in pairs}
    if timeline:  # the client's share: what the timeline, from arrival (or admission) to the end, does not cover
        marks = list(timeline.values())
        stages["client"] = latency_ms - (marks[-1] - marks[0])
    breakdown = {
        "latency_ms": round(latency_ms, 1),
        "timeline": timeline,
        "stages_ms": {name: round(ms, 1) for name, ms in stages.items()},
        "service": service,
    }
    if service.get("total_ms"):
        overhead_ms = latency_ms - service["total_ms"]
        breakdown |= {
            "gateway_overhead_ms": round(overhead_ms, 1),
            "gateway_overhead_pct": round(100 * overhead_ms / service["total_ms"], 2),
        }
    return breakdown


def level_breakdown(requests: list[dict]) -> dict:
    """Medians over a level's requests of each stage and service timing, and its gateway overhead."""

    def median(values: list[float]) -> float | None:
        return round(statistics.median(values), 2) if values else None

    def medians(key: str) -> dict:
        names = list(dict.fromkeys(name for request in requests for name in request[key]))
        return {name: median([r[key][name] for r in requests if name in r[key]]) for name in names}

    overheads = [r for r in requests if "gateway_overhead_ms" in r]
    return {
        "stages_ms_p50": medians("stages_ms"),
        "service_ms_p50": medians("service"),
        "gateway_overhead_ms": {
            "p50": median([r["gateway_overhead_ms"] for r in overheads]),
            "max": max((r["gateway_overhead_ms"] for r in overheads), default=None),
        },
        "gateway_overhead_pct": {
            "p50": median([r["gateway_overhead_pct"] for r in overheads]),
            "max": max((r["gateway_overhead_pct"] for r in overheads), default=None),
        },
    }


async def gpu_peak_mib(http: aiohttp.ClientSession, rest_url: str) -> dict:
    """The largest CUDA memory peaks of the stack's diffusion processes since they started (their /metrics), in
    MiB, or {"skipped": why} when they are not on this machine or not on CUDA. Levels run in rising concurrency,
    so each level's figure is its own peak unless an earlier level's was higher."""
    try:
        if not is_local(urlsplit(rest_url).hostname or ""):
            raise Skipped("the gateway is not on this machine")
        async with http.get("/ready") as reply:
            targets = list((await reply.json())["backends"].get("diffusion", {}))
        found = await asyncio.to_thread(listeners)
        pids = local_pids("diffusion", targets, found)
    except Skipped as exc:
        return {"skipped": str(exc)}
    grpc_ports = {int(target.rsplit(":", 1)[1]) for target in targets}
    peaks = dict.fromkeys(PEAK_GAUGES, 0.0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as scraper:
        for pid in sorted(pids):
            url = await metrics_url(scraper, pid, found, grpc_ports, ("chorus_diffusion_",))
            if url is None:
                return {"skipped": f"diffusion process {pid} serves no /metrics (metrics port -1?)"}
            async with scraper.get(url) as reply:
                values = parse_metrics(await reply.text())
            for name, gauge in PEAK_GAUGES.items():
                peaks[name] = max(peaks[name], values.get(gauge, 0.0) / MIB)
    if not any(peaks.values()):
        return {"skipped": "the diffusion service does not run on CUDA"}
    return {name: round(value, 1) for name, value in peaks.items()}


async def run(args, progress) -> list[dict]:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    levels = []
    # aiohttp, as `chorus bench tts`: httpx's pure-Python parsing took ~7 ms more to read a 10 s wav (1.8 MB) on
    # loopback, which would count as gateway overhead.
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    async with aiohttp.ClientSession(args.url, headers=headers, timeout=timeout) as http:
        warmup = []
        await open_connections(http, 1)
        for _ in range(args.warmup_requests):
            latency, error, request_id = await one(http, _body(args, seed=len(warmup)))
            if error is not None or request_id is None:
                raise RuntimeError(f"the warm-up request failed: {error}")
            warmup.append(request_breakdown(latency, await request_record(http, request_id)))
        for concurrency in args.concurrency:
            counter = progress.level(f"diffusion c={concurrency}", concurrency)
            bodies = [_body(args, seed=i) for i in range(concurrency)]
            await open_connections(http, concurrency)
            started = time.perf_counter()

            async def timed(body, counter=counter):
                result = await one(http, body)
                counter()
                return result

            results = await asyncio.gather(*(timed(body) for body in bodies))
            wall_s = time.perf_counter() - started
            latencies = sorted(latency for latency, error, _ in results if error is None)
            errors: dict[str, int] = {}
            for _, error, _ in results:
                if error is not None:
                    errors[error] = errors.get(error, 0) + 1
            # Read once the level is over, so the reads do not add to what is measured.
            requests = [
                request_breakdown(latency, await request_record(http, request_id))
                for latency, error, request_id in results
                if error is None and request_id is not None
            ]
            levels.append({
                "concurrency": concurrency, "completed": len(latencies), "errors": errors,
                "all_done_s": round(wall_s, 3),
                "latency_s": {"min": round(latencies[0], 3), "max": round(latencies[-1], 3)} if latencies else None,
                "requests_per_s": round(len(latencies) / wall_s, 3),
                "audio_s_per_s": round(len(latencies) * args.duration_s / wall_s, 2),
                **level_breakdown(requests),
                "gpu_peak_mib": await gpu_peak_mib(http, args.url),
                "requests": requests,
            })  # fmt: skip
            progress.done({key: value for key, value in levels[-1].items() if key != "requests"})
    if levels:
        levels[0]["warmup_requests"] = warmup
    return levels


def _body(args, seed: int) -> dict:
    return {"model": args.model, "prompt": AUDIO[seed % len(AUDIO)], "duration_s": args.duration_s,
            "num_steps": args.steps, "guidance_scale": args.guidance_scale, "seed": seed,
            "response_format": args.format}  # fmt: skip


TARGETS = (  # (concurrency, metric path, bound): issue 20's targets on one H100, each a maximum
    (1, ("all_done_s",), 1.0),
    (1, ("gateway_overhead_pct", "max"), 5.0),
    (8, ("all_done_s",), 5.0),
    (8, ("gateway_overhead_pct", "max"), 5.0),
)


def check_targets(levels: list[dict]) -> list[dict]:
    """Each target against the level of its concurrency; a level with a failed request meets none."""
    checks = []
    for concurrency, path, bound in TARGETS:
        for level in (level for level in levels if level["concurrency"] == concurrency):
            value, met = checked(level, path, bound, "max")
            met = met and level["completed"] == concurrency
            checks.append({"concurrency": concurrency, "metric": ".".join(path), "value": value, "bound": bound,
                           "kind": "max", "met": met})  # fmt: skip
    return checks


def stage_stacks(levels: list[dict]) -> list[list[float]]:
    """Per level, its median stages in timeline order (for the stacked plot)."""
    return [[ms or 0.0 for ms in level["stages_ms_p50"].values()] for level in levels]

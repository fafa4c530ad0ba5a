"""`chorus bench tts`: streaming speech through a running gateway (REST chunked PCM and/or gRPC `Speak`) at a
sweep of concurrency levels; each level keeps exactly `concurrency` requests in flight until its request count
is done, and says where the stack's time went meanwhile when its processes are on this machine (`breakdown`; off
with `--no-breakdown`). With `--chaos N` a talker or vocoder replica is killed every N seconds meanwhile (`chaos`).

`--format` picks the response format (pcm by default; how encoded audio is timed: `chorus.bench.speech_requests`).
`--client-processes` spreads each level's requests over several client processes (by default one per 64 streams
in flight, up to a quarter of the host's cores: `chorus.bench.client_processes`); each level reports its client
processes and how busy the busiest was (`client`). Each level's `ttfp_stages` splits the TTFP of a sample of its
requests at the stages their runs marked (`chorus.bench.ttfp`)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

from chorus.bench.breakdown import StepBreakdown
from chorus.bench.chaos import Chaos
from chorus.bench.client_processes import LevelLoad, Share, auto_client_processes, deal, run_in_processes, run_share
from chorus.bench.metrics import RequestTiming, steady_quarters, summarize
from chorus.bench.prompts import SPEECH
from chorus.bench.report import checked
from chorus.bench.speech_requests import SpeechClient, speech_body
from chorus.bench.ttfp import level_ttfp_stages

# A level's load: given the per-request progress callback, its responses and clock (LevelLoad).
Load = Callable[[Callable[[], None]], Awaitable[LevelLoad]]


async def run_level(
    load: Load, on_done, chaos: Chaos | None = None, steps: StepBreakdown | None = None
) -> tuple[dict, list[RequestTiming]]:
    """Runs a level's `load` (its breakdown `steps` started before); returns the level's summary, with the fail-overs
    `chaos` caused and where the client's time went, and its requests' timings."""
    level = await load(on_done)
    breakdown = await steps.finish() if steps is not None else None  # before reading the responses: off the clock
    timings = await asyncio.to_thread(lambda: [response.timed() for response in level.responses])
    summary = summarize(timings, level.wall_s) | {"steady_quarters": steady_quarters(timings, level.started)}
    summary["client"] = level.client_summary()
    if chaos is not None:
        summary["chaos"] = chaos.summary(timings)
    if breakdown is not None:
        summary["breakdown"] = breakdown
    return summary, timings


def in_process(client: SpeechClient, share: Share) -> Load:
    """A level's load sent from this process."""

    async def load(on_done) -> LevelLoad:
        responses, started, wall_s, cpu_s = await run_share(client, share, on_done)
        return LevelLoad(responses, started, wall_s, [cpu_s])

    return load


def in_processes(shares: list[Share], timeout_s: float) -> Load:
    """A level's load sent from one client process per share."""
    return lambda on_done: run_in_processes(shares, on_done, timeout_s)


async def run(args, progress) -> list[dict]:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    levels = []
    streams = max(args.concurrency)
    async with SpeechClient(args.url, args.grpc_target, headers, args.request_timeout_s, streams) as client:
        http = client.http
        if args.model is None:
            async with http.get("/v1/models") as reply:
                model = (await reply.json())["data"][0]["id"]
        else:
            model = args.model
        texts = [SPEECH[name] for name in args.prompts]
        chaos = Chaos(http, args.chaos) if args.chaos else None
        steps = None if args.no_breakdown else StepBreakdown(http, args.url, args.grpc_target)
        killing = asyncio.create_task(chaos.run()) if chaos is not None else None
        try:
            transports = ("rest", "grpc") if args.transport == "both" else (args.transport,)
            for transport, concurrency in itertools.product(transports, args.concurrency):
                num_requests = args.requests_per_level or max(8, 2 * concurrency)
                bodies = [
                    speech_body(model, texts[index % len(texts)], index, args.fixed_frames, args.voice, args.format)
                    for index in range(num_requests)
                ]
                num_processes = min(args.client_processes or auto_client_processes(concurrency), concurrency)
                shares = [
                    Share(transport, args.url, args.grpc_target, headers, args.request_timeout_s, streams, share_bodies)
                    for share_bodies, streams in deal(bodies, concurrency, num_processes)
                ]
                load = in_process(client, shares[0]) if num_processes == 1 else in_processes(shares, args.timeout_s)
                counter = progress.level(f"{transport} c={concurrency}", num_requests)
                if steps is not None:
                    await steps.start()
                summary, timings = await run_level(load, counter, chaos, steps)
                summary["ttfp_stages"] = await level_ttfp_stages(http, timings)  # read after the level, not timed
                levels.append({"transport": transport, "concurrency": concurrency} | summary)
                progress.done(levels[-1])
        finally:
            if killing is not None:
                killing.cancel()
            if steps is not None:
                await steps.close()
    return levels


TARGETS = (  # (concurrency, metric path, bound, "max" or "min"): issue 18's targets on one H100
    (1, ("ttfp_ms", "p50"), 20.0, "max"),
    (1, ("rtf", "p50"), 0.05, "max"),
    (64, ("audio_s_per_s",), 700.0, "min"),
    (64, ("ttfp_ms", "p95"), 250.0, "max"),
    (64, ("underrun_events",), 0, "max"),
    (256, ("audio_s_per_s",), 1000.0, "min"),
    (256, ("ttfp_ms", "p95"), 500.0, "max"),
    (256, ("underrun_events",), 0, "max"),
)


def check_targets(levels: list[dict]) -> list[dict]:
    """Each target against every measured level of its concurrency (per transport)."""
    checks = []
    for concurrency, path, bound, kind in TARGETS:
        for level in (level for level in levels if level["concurrency"] == concurrency):
            value, met = checked(level, path, bound, kind)
            checks.append({"transport": level["transport"], "concurrency": concurrency, "metric": ".".join(path),
                           "value": value, "bound": bound, "kind": kind, "met": met})  # fmt: skip
    return checks

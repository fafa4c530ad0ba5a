"""A `chorus bench tts` level's requests sent from several client processes, so the client is not what is measured.

One Python process streaming hundreds of responses is itself a bottleneck: on an H100 host at 256 gRPC streams the
bench process ran its core at 92 % over its run, and the client's share of each request's time to first audio
(`ttfp_stages.client`: sending the request, and the bytes after the gateway journaled them) was 140 ms at its
median, against 9 ms at 64 streams. Here a level's requests are dealt round-robin to N processes (request i to
process i mod N, with the same body and seed as from one process), each keeping its share of the concurrency in
flight on connections of its own. Every process connects first; the level's clock starts when all are ready.
Timestamps are `time.perf_counter`, one monotonic clock for every process of the host, so the timings of all the
processes are read as those of one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import multiprocessing
import os
import queue
import time
from collections.abc import Callable

from chorus.bench.speech_requests import Response, SpeechClient

STREAMS_PER_PROCESS = 64  # what one client process streams without falling behind (auto mode)
_POLL_S = 0.2


class ClientProcessError(RuntimeError):
    """A client process failed or went silent; the level has no result."""


def auto_client_processes(concurrency: int, cpu_count: int | None = None) -> int:
    """One process per STREAMS_PER_PROCESS requests in flight, leaving three quarters of the host's cores to the
    stack when it runs here: 1 at 64 streams, 4 at 256 on a 16-core host, always 1 on 2 to 7 cores."""
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(math.ceil(concurrency / STREAMS_PER_PROCESS), cores // 4))


@dataclasses.dataclass(frozen=True, slots=True)
class Share:
    """What one client process sends in a level."""

    transport: str  # "rest" or "grpc"
    url: str
    grpc_target: str
    headers: dict[str, str]
    request_timeout_s: float
    concurrency: int
    bodies: list[dict]


@dataclasses.dataclass(slots=True)
class LevelLoad:
    """A level's responses in request order, when its clock started (perf_counter) and how long it ran, and the
    CPU time each client process spent meanwhile."""

    responses: list[Response]
    started: float
    wall_s: float
    cpu_s: list[float]

    def client_summary(self) -> dict:
        """`processes`, their `cpu_s_per_s` together, and `busiest_cpu_fraction`: the busiest process's CPU time
        over the wall time (near 1, that process was saturated, and the level measured the client too)."""
        wall_s = max(self.wall_s, 1e-9)
        return {
            "processes": len(self.cpu_s),
            "cpu_s_per_s": round(sum(self.cpu_s) / wall_s, 3),
            "busiest_cpu_fraction": round(max(self.cpu_s) / wall_s, 3),
        }


async def run_share(
    client: SpeechClient, share: Share, on_done: Callable[[], None], go: Callable[[], object] | None = None
) -> tuple[list[Response], float, float, float]:
    """Sends `share.bodies` with `share.concurrency` in flight on `client`, after `await go()` when given; returns
    the responses in order, the perf_counter the share started at, its wall time and this process's CPU time."""
    if share.transport == "grpc":
        await client.connect_grpc()
    slots = asyncio.Semaphore(share.concurrency)

    async def one(index: int) -> Response:
        async with slots:
            response = await client.send(share.transport, share.bodies[index], index % share.concurrency)
        on_done()
        return response

    if go is not None:
        await go()
    cpu_started, started = time.process_time(), time.perf_counter()
    responses = await asyncio.gather(*(one(index) for index in range(len(share.bodies))))
    return responses, started, time.perf_counter() - started, time.process_time() - cpu_started


def deal(bodies: list[dict], concurrency: int, processes: int) -> list[tuple[list[dict], int]]:
    """Each process's bodies (request i to process i mod N) and its share of the concurrency."""
    return [(bodies[k::processes], concurrency // processes + (k < concurrency % processes)) for k in range(processes)]


async def run_in_processes(shares: list[Share], on_done: Callable[[], None], timeout_s: float) -> LevelLoad:
    """Runs each share in a process of its own (spawned, so no state of this one is inherited) and gathers the
    responses in request order (share k holds requests k, k + N, …). A process that fails ends the level with a
    ClientProcessError naming it; none outlives the call."""
    context = multiprocessing.get_context("spawn")
    go, done = context.Event(), context.Queue()
    pipes = [context.Pipe(duplex=False) for _ in shares]
    processes = [
        context.Process(target=_serve_share, args=(k, share, sender, go, done), daemon=True, name=f"bench-client-{k}")
        for k, (share, (_, sender)) in enumerate(zip(shares, pipes, strict=True))
    ]
    for process in processes:
        process.start()
    finished = False
    try:
        for k, (receiver, _) in enumerate(pipes):
            _check(k, await asyncio.to_thread(_receive, receiver, processes[k], timeout_s))
        started = time.perf_counter()
        go.set()
        loop = asyncio.get_running_loop()
        await asyncio.to_thread(_count_done, done, shares, lambda: loop.call_soon_threadsafe(on_done), processes)
        wall_s = time.perf_counter() - started
        results = [_check(k, await asyncio.to_thread(_receive, receiver, processes[k], timeout_s))
                   for k, (receiver, _) in enumerate(pipes)]  # fmt: skip
        finished = True
    finally:
        for process in processes:
            process.join(timeout=5 if finished else 0)
            if process.is_alive():
                process.kill()
    responses: list[Response] = [None] * sum(len(share.bodies) for share in shares)  # type: ignore[list-item]
    for k, (share_responses, _) in enumerate(results):
        responses[k :: len(shares)] = share_responses
    return LevelLoad(responses, started, wall_s, [cpu_s for _, cpu_s in results])


def _serve_share(index: int, share: Share, sender, go, done) -> None:
    """A client process: connect, say "ready", wait for the level to start, send the share, return the responses
    and this process's CPU time (or the error that stopped it)."""

    async def level_started() -> None:
        await asyncio.to_thread(go.wait)

    async def serve():
        async with SpeechClient(share.url, share.grpc_target, share.headers, share.request_timeout_s,
                                share.concurrency) as client:  # fmt: skip
            if share.transport == "grpc":
                await client.connect_grpc()
            sender.send(("ready", None))
            responses, _, _, cpu_s = await run_share(client, share, lambda: done.put(index), level_started)
        return responses, cpu_s

    try:
        sender.send(("result", asyncio.run(serve())))
    except BaseException as exc:  # reported to the parent, which raises it
        sender.send(("error", f"{type(exc).__name__}: {exc}"))


def _receive(receiver, process, timeout_s: float):
    """The next message from a client process, or ("error", why) if it died or said nothing for `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not receiver.poll(_POLL_S):
        if not process.is_alive():
            return "error", f"exited with code {process.exitcode}"
        if time.monotonic() > deadline:
            return "error", f"said nothing for {timeout_s:.0f} s"
    return receiver.recv()


def _check(index: int, message: tuple[str, object]):
    kind, payload = message
    if kind == "error":
        raise ClientProcessError(f"bench client process {index}: {payload}")
    return payload


def _count_done(done, shares: list[Share], on_done: Callable[[], None], processes) -> None:
    """Calls on_done for each request the processes report done (each report names its process); returns early if a
    process with requests still to report has died (its pipe then says why). A process's reports reach the queue
    before it exits."""
    remaining = [len(share.bodies) for share in shares]
    while any(remaining):
        try:
            index = done.get(timeout=_POLL_S)
        except queue.Empty:
            if any(count and not process.is_alive() for count, process in zip(remaining, processes, strict=True)):
                return
            continue
        remaining[index] -= 1
        on_done()

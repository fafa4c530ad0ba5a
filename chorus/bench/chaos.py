"""`chorus bench tts --chaos N`: a backend replica killed (SIGKILL) every N seconds while the bench runs, and
how long the streams in flight then went without audio.

The replicas are the talker and vocoder targets the gateway reports in `/ready`; a kill goes to the process
listening on a target's port on this machine (the bench runs beside the stack), and only when another replica
of the same backend is healthy, so the kill tests fail-over rather than an outage. Whatever supervises the
stack (`chorus up`, Kubernetes) restarts it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import time

import aiohttp

from chorus.bench.local_processes import listeners, pids_on
from chorus.bench.metrics import RequestTiming, percentile

SPEECH_BACKENDS = ("talker", "vocoder")


@dataclasses.dataclass
class Kill:
    at: float  # time.perf_counter(), the clock of RequestTiming
    backend: str
    target: str


class Chaos:
    def __init__(self, session: aiohttp.ClientSession, interval_s: float, seed: int = 0) -> None:
        self.session = session
        self.interval_s = interval_s
        self.rng = random.Random(seed)
        self.kills: list[Kill] = []

    async def run(self) -> None:
        """Kills a replica every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.kill_one()

    async def kill_one(self) -> Kill | None:
        async with self.session.get("/ready") as reply:
            backends = (await reply.json())["backends"]
        candidates = [
            (backend, target)
            for backend in SPEECH_BACKENDS
            for target, is_healthy in backends.get(backend, {}).items()
            if is_healthy and sum(backends[backend].values()) > 1
        ]
        if not candidates:
            return None
        backend, target = self.rng.choice(candidates)
        pids = pids_on(int(target.rsplit(":", 1)[1]), listeners())
        if not pids:
            return None  # not on this machine
        os.kill(min(pids), signal.SIGKILL)
        kill = Kill(time.perf_counter(), backend, target)
        self.kills.append(kill)
        return kill

    def summary(self, timings: list[RequestTiming]) -> dict:
        """The kills during these requests, and per request in flight at a kill the seconds until its next audio."""
        started = min((t.sent_at for t in timings), default=0.0)
        finished = max((t.finished_at or t.sent_at for t in timings), default=0.0)
        kills = [kill for kill in self.kills if started <= kill.at <= finished]
        gaps = failover_gaps([kill.at for kill in kills], timings)
        return {
            "kills": [{"backend": kill.backend, "target": kill.target} for kill in kills],
            "streams_in_flight_at_kills": len(gaps),
            "kill_to_next_audio_s": {f"p{q}": round(percentile(gaps, q), 3) if gaps else None for q in (50, 95)}
            | {"max": round(max(gaps), 3) if gaps else None},
        }


def failover_gaps(kill_times: list[float], timings: list[RequestTiming]) -> list[float]:
    """For each kill and each request with audio before and after it: seconds from the kill to its next audio."""
    gaps = []
    for at in kill_times:
        for timing in timings:
            arrivals = [arrived for arrived, _ in timing.arrivals]
            if arrivals and arrivals[0] < at < arrivals[-1]:
                gaps.append(next(arrived for arrived in arrivals if arrived > at) - at)
    return gaps

"""Chaos: processes killed (SIGKILL) or frozen (SIGSTOP) at random under load, and nothing is lost.

Two gateway processes and two replicas of every backend (tiny CPU models, a real Redis, loopback) serve a
steady mix of streamed speech (raw PCM and MP3), SSE speech and async text-to-audio, every request seeded.
First each request runs undisturbed; then the same requests run again while, every few seconds, a process
chosen at random is killed and restarted a second later, or frozen for a few seconds. Never the last
serving replica of a backend: then every request must end done with the answer of its undisturbed run
(`workload.difference`) — none failed, hung, cut short, duplicated or different. The test prints its figures.
"""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest
from cluster import Cluster, Outcome, ResumingClient, two_of_everything
from workload import judge, load, references, runs_lost, undisturbed_reconnects

PHASE_S = 45.0  # the faulty phase keeps load on for this long
FAULT_INTERVAL_S = 4.0
STOP_S = 4.0  # how long a frozen process stays frozen
SEED = 20261125


class Faults:
    """Every `interval_s`, kills or freezes one process whose kind keeps another serving replica."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.log: list[tuple[float, str, str]] = []  # (time, action, member)

    async def run(self, until: float) -> None:
        while time.monotonic() + FAULT_INTERVAL_S < until:
            await asyncio.sleep(FAULT_INTERVAL_S)
            candidates = [m for m in self.cluster.members if await self._has_serving_peer(m)]
            if not candidates:
                continue
            member = self.rng.choice(candidates)
            if self.rng.random() < 0.7:
                self.log.append((time.monotonic(), "SIGKILL", member.name))
                await asyncio.to_thread(self.cluster.kill, member)
            else:
                self.log.append((time.monotonic(), "SIGSTOP", member.name))
                self.cluster.stop(member)
                asyncio.get_running_loop().call_later(STOP_S, self.cluster.resume, member)

    async def _has_serving_peer(self, member) -> bool:
        if not await asyncio.to_thread(self.cluster.is_serving, member):
            return False
        peers = [m for m in self.cluster.of(member.kind) if m is not member]
        return any([await asyncio.to_thread(self.cluster.is_serving, peer) for peer in peers])


def resumed_after(faults: list[tuple[float, str, str]], outcomes: list[Outcome]) -> list[float]:
    """For each fault and each stream in flight at that moment: seconds from the fault to its next audio."""
    gaps = []
    for at, _, _ in faults:
        for outcome in outcomes:
            times = outcome.chunk_times
            if times and times[0] < at < times[-1]:
                gaps.append(next(t for t in times if t > at) - at)
    return gaps


@pytest.fixture
def cluster(redis_url, tmp_path):
    with two_of_everything(redis_url, tmp_path) as cluster:
        yield cluster


@pytest.mark.timeout(300)
async def test_no_request_is_lost_or_changed_while_processes_die(cluster, redis_url, capsys):
    started = time.monotonic()
    client = ResumingClient(cluster.gateway_urls, deadline_s=60.0)
    requests, reference = await references(cluster, client)
    lost_undisturbed = runs_lost(cluster)

    faults = Faults(cluster, random.Random(SEED))
    until = time.monotonic() + PHASE_S
    _, answers = await asyncio.gather(faults.run(until), load(client, requests, until))

    failed, different, largest_lsb = judge(answers, requests, reference, redis_url)
    gaps = resumed_after(faults.log, [answer for _, answer in answers])
    with capsys.disabled():  # the figures show in every run, not only a failing one
        print(
            f"\nchaos: undisturbed first ({undisturbed_reconnects(reference)} client reconnects, "
            f"{lost_undisturbed} runs lost to a lease that lapsed), then "
            f"{len(answers)} requests ({sum(a.reconnects for _, a in answers)} client reconnects), "
            f"{len(faults.log)} faults ({', '.join(f'{action} {name}' for _, action, name in faults.log)}), "
            f"restarts {sum(m.restarts for m in cluster.members)}; failed {len(failed)}, different {len(different)}, "
            f"largest audio difference {largest_lsb} LSB; fault → next audio of the streams in flight: "
            f"p50 {np.percentile(gaps, 50) if gaps else 0:.2f} s, p95 {np.percentile(gaps, 95) if gaps else 0:.2f} s, "
            f"max {max(gaps, default=0):.2f} s over {len(gaps)} streams; {time.monotonic() - started:.0f} s in all"
        )
    assert len(faults.log) >= 5, "too few faults injected to prove anything"
    assert not failed, f"requests failed: {failed}"
    assert not different, f"requests whose answer differs from their undisturbed run: {different}"

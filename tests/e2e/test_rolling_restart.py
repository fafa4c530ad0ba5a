"""A rolling restart under load fails no request: every process, one at a time, gets SIGTERM (as Kubernetes
sends it), drains (a backend finishes or hands back its streams, a gateway hands its runs to the other
gateway), exits and is started again; the next one goes once it serves. Every request of the steady load
ends done with the answer of its undisturbed run."""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster import Cluster, ResumingClient, two_of_everything
from workload import judge, load, references, runs_lost, undisturbed_reconnects


@pytest.fixture
def cluster(redis_url, tmp_path):
    grace = {f"CHORUS_{kind}_GRACE_S": "3" for kind in ("GATEWAY", "TALKER", "VOCODER", "DIFFUSION")}
    with two_of_everything(redis_url, tmp_path, grace) as cluster:
        yield cluster


async def _restart_one_at_a_time(cluster: Cluster, timings: list[tuple[str, float]]) -> None:
    for member in cluster.members:
        started = time.monotonic()
        process = member.process
        cluster.terminate(member)
        await asyncio.to_thread(process.wait, 60)
        while not await asyncio.to_thread(cluster.is_serving, member):
            assert time.monotonic() - started < 90, f"{member.name} did not come back"
            await asyncio.sleep(0.2)
        timings.append((member.name, time.monotonic() - started))


@pytest.mark.timeout(300)
async def test_a_rolling_restart_under_load_fails_no_request(cluster, redis_url, capsys):
    client = ResumingClient(cluster.gateway_urls, deadline_s=60.0)
    requests, reference = await references(cluster, client)
    lost_undisturbed = runs_lost(cluster)

    timings: list[tuple[str, float]] = []
    restarts = asyncio.create_task(_restart_one_at_a_time(cluster, timings))
    answers = await load(client, requests, until=float("inf"), lanes=3, stop=restarts)

    failed, different, largest_lsb = judge(answers, requests, reference, redis_url)
    with capsys.disabled():  # the figures show in every run, not only a failing one
        print(
            f"\nrolling restart: undisturbed first ({undisturbed_reconnects(reference)} client reconnects, "
            f"{lost_undisturbed} runs lost to a lease that lapsed), then "
            f"{len(answers)} requests ({sum(a.reconnects for _, a in answers)} client reconnects) "
            f"while {len(timings)} processes restarted one at a time "
            f"({', '.join(f'{name} {seconds:.1f} s' for name, seconds in timings)}); failed {len(failed)}, "
            f"different {len(different)}, largest audio difference {largest_lsb} LSB"
        )
    assert len(timings) == len(cluster.members)
    assert not failed, f"requests failed: {failed}"
    assert not different, f"requests whose answer differs from their undisturbed run: {different}"

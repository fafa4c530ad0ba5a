"""`chorus bench tts --client-processes N`: a level's requests sent from N spawned client processes against a real
tiny stack, dealt as one process would send them, and a client process that fails ending the run with its reason."""

from __future__ import annotations

import argparse
import time

import pytest
from speech_stack import speech_stack

from chorus.bench import tts
from chorus.bench.cli import register
from chorus.bench.client_processes import ClientProcessError, Share, auto_client_processes, deal, run_in_processes

FRAME_S = 0.08


def test_requests_are_dealt_round_robin_with_the_concurrency_split_evenly():
    bodies = [{"seed": index} for index in range(7)]
    dealt = deal(bodies, concurrency=5, processes=3)
    assert [[body["seed"] for body in share] for share, _ in dealt] == [[0, 3, 6], [1, 4], [2, 5]]
    assert [streams for _, streams in dealt] == [2, 2, 1]


def test_auto_mode_runs_a_process_per_64_streams_on_a_quarter_of_the_cores():
    levels = (1, 64, 65, 256, 1024)
    assert [auto_client_processes(concurrency, cpu_count=16) for concurrency in levels] == [1, 1, 2, 4, 4]
    assert auto_client_processes(256, cpu_count=2) == 1, "a small host keeps its cores for the stack"


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


class _Counting:
    def __init__(self) -> None:
        self.ticks = 0

    def level(self, name, num_requests):
        def tick():
            self.ticks += 1

        return tick

    def done(self, level):
        pass


async def test_a_level_from_two_client_processes_streams_every_request(start_gateway, redis_url, tmp_path):
    progress = _Counting()
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, target, _, _):
        args = _args([
            "bench", "tts", "--url", str(http.base_url), "--grpc-target", target, "--concurrency", "2",
            "--requests-per-level", "5", "--fixed-frames", "6", "--prompts", "short", "--client-processes", "2",
            "--no-breakdown", "--out", str(tmp_path),
        ])  # fmt: skip
        levels = await tts.run(args, progress)
    assert [level["transport"] for level in levels] == ["rest", "grpc"]
    assert progress.ticks == 10, "every request reported done to this process's progress"
    for level in levels:
        assert level["completed"] == 5 and not level["errors"], level
        assert level["audio_s"] == pytest.approx(5 * 6 * FRAME_S), "every request's audio, counted from its bytes"
        assert 0 < level["ttfp_ms"]["p50"] <= level["latency_ms"]["p50"] <= level["wall_s"] * 1000
        assert level["client"]["processes"] == 2
        assert 0 < level["client"]["busiest_cpu_fraction"] <= level["client"]["cpu_s_per_s"]
        assert level["ttfp_stages"]["requests"] == 5, "the request ids came back from the processes"


async def test_a_client_process_that_cannot_connect_ends_the_level_with_its_reason():
    # Nothing listens on port 9 of loopback: the gRPC channels never become ready.
    shares = [Share("grpc", "http://127.0.0.1:9", "127.0.0.1:9", {}, 2.0, 1, [{}]) for _ in range(2)]
    started = time.monotonic()
    with pytest.raises(ClientProcessError, match="bench client process 0: TimeoutError"):
        await run_in_processes(shares, on_done=lambda: None, timeout_s=60)
    assert time.monotonic() - started < 30, "bounded by the connect timeout, not the run's"

"""`chorus bench tts` / `chorus bench diffusion` against a real tiny stack, and the metric functions on
hand-made timelines."""

from __future__ import annotations

import argparse
import asyncio
import json
import math

import pytest
from speech_stack import hosted, speech_stack

from chorus.bench import diffusion, tts
from chorus.bench.cli import register
from chorus.bench.diffusion import stage_stacks
from chorus.bench.metrics import RequestTiming, percentile, steady_quarters, summarize, underruns
from chorus.bench.report import write
from chorus.bench.ttfp import LATENCY_STAGES, STAGES, TALKER_STAGES
from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.runtime.gc_pauses import watch_gc_pauses

FRAME_S = 0.08


def test_percentile_interpolates_between_ranks():
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    assert math.isnan(percentile([], 50))


def test_underruns_of_a_real_time_player():
    steady = [(i * 0.08, 0.08) for i in range(20)]  # each 80 ms piece arrives as the last one ends
    assert underruns(steady) == []
    ahead = [(0.0, 1.0), (1.05, 0.5)]  # 50 ms late after a 1 s buffer: under the 100 ms threshold
    assert underruns(ahead) == []
    stalls = [(0.0, 0.2), (0.5, 0.2), (0.75, 0.2), (1.5, 0.2)]
    # dry for 0.3 s waiting for piece 1 (the clock shifts), fine at 0.75, dry for 0.55 s waiting for piece 3
    assert underruns(stalls) == [(1, pytest.approx(0.3)), (3, pytest.approx(0.55))]
    assert underruns([]) == []
    late_second = RequestTiming(0.0, 0.1, 2.0, [(0.1, 0.08), (0.4, 0.16), (0.5, 1.0)])
    summary = summarize([RequestTiming(0.0, 0.1, 2.0, stalls), late_second], wall_s=2.0)
    assert summary["underrun_events"] == 3 and summary["requests_with_underruns"] == 2
    assert summary["underruns_by_piece"] == {"1": 2, "3": 1}
    assert summary["underrun_wait_ms"] == {"p50": 300.0, "p99": 545.0}


def test_steady_quarters_show_a_run_that_slows_down():
    def request(sent_at: float, ttfp_s: float, piece_s: float) -> RequestTiming:
        arrivals = [(sent_at + ttfp_s, piece_s), (sent_at + ttfp_s + 1.0, piece_s)]
        return RequestTiming(sent_at, sent_at + ttfp_s, sent_at + ttfp_s + 1.0, arrivals)

    # sent at 0, 1, …, 8 s, each getting two pieces 1 s apart; from 6 s on, first audio comes 0.5 s after the
    # request instead of 0.1 s, and its pieces carry 0.5 s of audio instead of 1 s
    timings = [request(float(t), 0.1, 1.0) if t < 6 else request(float(t), 0.5, 0.5) for t in range(9)]
    quarters = steady_quarters(timings, started_at=0.0)  # windows of 2 s over the 8 s until the last send
    assert [q["ttfp_p95_ms"] for q in quarters] == [100.0, 100.0, 100.0, 500.0]
    assert [q["audio_s_per_s"] for q in quarters] == [1.5, 2.0, 2.0, 1.25]
    assert steady_quarters(timings[:1], started_at=0.0) == [], "all sent at once: no steady part"


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


class _Quiet:
    def level(self, name, num_requests):
        return lambda: None

    def done(self, level):
        pass


async def test_bench_tts_measures_rest_and_grpc_on_a_real_stack(start_gateway, redis_url, tmp_path):
    watch_gc_pauses()  # as a service's host does once it serves
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, target, _, _):
        args = _args([
            "bench", "tts", "--url", str(http.base_url), "--grpc-target", target, "--concurrency", "1,2",
            "--requests-per-level", "3", "--fixed-frames", "9", "--prompts", "short", "--out", str(tmp_path),
        ])  # fmt: skip
        levels = await tts.run(args, _Quiet())
    assert [(level["transport"], level["concurrency"]) for level in levels] == [
        ("rest", 1), ("rest", 2), ("grpc", 1), ("grpc", 2),
    ]  # fmt: skip
    for level in levels:
        assert level["completed"] == 3 and not level["errors"], level
        assert level["audio_s"] == pytest.approx(3 * 9 * FRAME_S), "fixed frames: audio counted from bytes"
        assert 0 < level["ttfp_ms"]["p50"] <= level["latency_ms"]["p50"]
        assert level["rtf"]["p50"] == pytest.approx(level["latency_ms"]["p50"] / 1000 / (9 * FRAME_S), rel=0.5)
        steps = level["breakdown"]  # the whole stack is this process, its REST port serving every /metrics
        assert "skipped" not in steps, steps
        assert steps["talker_processes"] == steps["vocoder_processes"] == steps["gateway_processes"] == 1, steps
        assert steps["talker_steps"] >= 9 and 1 <= steps["talker_mean_batch_size"] <= 2
        assert steps["talker_prefills"] == 3 and steps["talker_prefill_ms_per_request"] > 0
        assert 0 < steps["talker_prefill_cpu_ms_per_request"] <= steps["talker_prefill_ms_per_request"] + 0.1
        assert steps["vocoder_audio_s"] == pytest.approx(level["audio_s"]) and steps["vocoder_mean_batch_size"] >= 1
        assert steps["talker_plus_vocoder_busy_fraction"] > 0 and steps["speech_cpu_ms_per_talker_step"] > 0
        assert steps["gateway_cpu_ms_per_chunk"] > 0 and steps["gateway_cpu_ms_per_audio_s"] > 0
        # A level allocates thousands of objects: the collector ran, and each of its pauses was timed.
        assert steps["speech_gc_collections"] > 0 and steps["speech_gc_pause_ms"] > 0, steps
        assert 0 <= steps["speech_gc_pauses_over_25ms"] <= steps["speech_gc_collections"], steps
        # The event loops were watched all through the level (here the speech services' and the gateway's is one).
        assert steps["speech_loop_lag_ms_mean"] >= 0 and steps["gateway_loop_lag_ms_mean"] >= 0, steps
        assert steps["speech_loop_lags_over_50ms"] >= 0 and steps["gateway_loop_lags_over_50ms"] >= 0, steps
        # A stream's last frames may be decoded before its end of input arrives: then it has no time after it.
        end_wait_ms, end_tail_ms = steps["vocoder_end_wait_ms_mean"], steps["vocoder_end_tail_ms_mean"]
        assert (end_wait_ms, end_tail_ms) == (None, None) or 0 <= end_wait_ms <= end_tail_ms < 5000, steps
        # One process here: speech and gateway memory are the same process's; no GPU series off CUDA.
        assert steps["memory_mib"].keys() == {"speech_rss_mib", "gateway_rss_mib"}, steps["memory_mib"]
        assert steps["memory_mib"]["speech_rss_mib"]["max"] > 100
        assert len(level["steady_quarters"]) == (4 if level["concurrency"] < 3 else 0)
        # The client's CPU time over the level: here the stack shares the process, so it is the stack's too.
        assert 0 < level["client_cpu_s_per_s"] < 2.5, level["client_cpu_s_per_s"]
        # Every request's TTFP split at its run's marks: the parts are positive and add up to it.
        stages = level["ttfp_stages"]
        assert stages["requests"] == 3 and list(stages["p50_ms"]) == list(STAGES + TALKER_STAGES), stages
        assert stages["p50_ms"]["admission"] >= 0, stages  # no wait for a slot at this load: about 0
        assert all(ms > 0 for stage, ms in stages["p50_ms"].items() if stage != "admission"), stages
        # Each request's parts add up to its own TTFP (test_bench_ttfp.py); the medians of three requests' parts need
        # not add up to the median TTFP, but a stage's median of three non-negative parts is at most half their sum,
        # so the medians add up to at most half the three TTFPs t1 ≤ t2 ≤ t3, so to t2 + t3 / 2: below 1.5 × the p99.
        assert sum(stages["p50_ms"][stage] for stage in STAGES) <= 1.5 * level["ttfp_ms"]["p99"], stages
        # The talker's own timings split its stage: its engine's queue and first frame, the rest in transit.
        in_transit_or_made = ("talker_call", "talker_accept", "talker_first_frame", "talker_out")
        assert all(stages["p50_ms"][stage] > 0 for stage in in_transit_or_made), stages
        # The slowest 5 % of three requests is the slowest one: its parts add up to its TTFP, above the median.
        slowest = level["slowest_ttfp_stages"]
        assert slowest["requests"] == 1, slowest
        assert sum(slowest["p50_ms"][stage] for stage in STAGES) >= level["ttfp_ms"]["p50"], slowest
        # The same for the latency, split at the end of the frames and of the PCM.
        tail = level["latency_stages"]
        assert tail["requests"] == 3 and list(tail["p50_ms"]) == list(LATENCY_STAGES), tail
        assert all(tail["p50_ms"][stage] > 0 for stage in ("first_frame", "frames", "client")), tail
        # From the last PCM to the record's end is one Redis write, 0.1–0.5 ms here: at the timeline's 0.1 ms
        # rounding it can read 0.0, never less (the end is marked after the last PCM).
        assert tail["p50_ms"]["finish"] >= 0, tail
        assert sum(tail["p50_ms"].values()) <= 1.5 * level["latency_ms"]["p99"], tail
        if not level["underrun_events"]:  # else the pieces waited for are timed (test_bench_ttfp.py)
            assert level["underrun_stages"] == {"skipped": "no player ran dry"}, level["underrun_stages"]
    path = write(tmp_path, "tts", {"concurrency": [1, 2]}, levels, tts.check_targets(levels), "cpu test")
    report = json.loads(path.read_text())
    assert report["levels"] == levels and report["targets"][0]["metric"] == "ttfp_ms.p50"
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_bench_tts_keeps_what_the_stack_said_of_failed_requests(start_gateway, redis_url, tmp_path):
    """A count of errors does not say why: each kind keeps its first requests' ids and messages."""
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, target, _, _):
        args = _args([
            "bench", "tts", "--url", str(http.base_url), "--grpc-target", target, "--concurrency", "2",
            "--requests-per-level", "4", "--fixed-frames", "9", "--prompts", "short", "--voice", "nobody",
        ])  # fmt: skip
        levels = await tts.run(args, _Quiet())
    rest, grpc_level = levels
    assert rest["errors"] == {"HTTP 404": 4} and grpc_level["errors"] == {"NOT_FOUND": 4}, levels
    for level in levels:
        assert level["completed"] == 0
        (examples,) = level["error_examples"].values()
        assert len(examples) == 3, "the first few of a kind"
        assert all("nobody" in example["message"] for example in examples), examples
    # Refused before it became a request (its voice unknown), none got a request id.
    assert all(example["request_id"] is None for example in rest["error_examples"]["HTTP 404"])


async def test_bench_tts_counts_a_request_that_failed_after_it_began_as_an_error(start_gateway, redis_url, tmp_path):
    """More frames than the talker makes: the gateway takes the request, the talker refuses it. REST answers its
    error status; over gRPC it is the stream's Final, which the bench reads as the error it is, not as a complete
    answer without audio."""
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, target, _, _):
        args = _args([
            "bench", "tts", "--url", str(http.base_url), "--grpc-target", target, "--concurrency", "1",
            "--requests-per-level", "2", "--fixed-frames", "1000", "--prompts", "short",
        ])  # fmt: skip
        levels = await tts.run(args, _Quiet())
    rest, grpc_level = levels
    assert rest["errors"] == {"HTTP 400": 2} and grpc_level["errors"] == {"INVALID_ARGUMENT": 2}, levels
    assert rest["completed"] == grpc_level["completed"] == 0
    (examples,) = grpc_level["error_examples"].values()
    assert all("max_frames" in example["message"] and example["request_id"] for example in examples), examples


@pytest.mark.parametrize("response_format", ["mp3", "opus"])
async def test_bench_tts_times_encoded_formats_by_their_duration(start_gateway, redis_url, tmp_path, response_format):
    async with speech_stack(start_gateway, redis_url, str(tmp_path)) as (_, http, target, _, _):
        args = _args([
            "bench", "tts", "--url", str(http.base_url), "--grpc-target", target, "--concurrency", "1",
            "--requests-per-level", "2", "--fixed-frames", "9", "--prompts", "short", "--format", response_format,
        ])  # fmt: skip
        levels = await tts.run(args, _Quiet())
    assert [level["transport"] for level in levels] == ["rest", "grpc"]
    for level in levels:
        assert level["completed"] == 2 and not level["errors"], level
        # Encoders pad to whole frames (mp3: 1152 samples, opus: 20 ms) and add their priming delay.
        assert level["audio_s"] == pytest.approx(2 * 9 * FRAME_S, abs=2 * 0.1), "seconds from the packets"
        assert 0 < level["ttfp_ms"]["p50"] <= level["latency_ms"]["p50"]
        # Underruns are not asserted: whether this CPU keeps up with real time is not what is tested here (how
        # each piece is credited is, in test_bench_encoded_timing.py).


async def test_bench_diffusion_runs_concurrent_requests(start_gateway, redis_url, tmp_path):
    config = DiffusionConfig(device="cpu", metrics_port=-1, grace_s=1.0)
    async with (
        hosted(config, DiffusionService(config)) as replica,
        start_gateway(redis_url, diffusion_targets=(replica,)) as (gateway, http, _),
    ):
        for _ in range(200):
            if gateway.context.backends.replicas["diffusion"][0].is_healthy:
                break
            await asyncio.sleep(0.05)
        args = _args([
            "bench", "diffusion", "--url", str(http.base_url), "--concurrency", "1,2", "--steps", "3",
            "--duration-s", "0.5", "--format", "mp3",
        ])  # fmt: skip
        levels = await diffusion.run(args, _Quiet())
    assert [level["concurrency"] for level in levels] == [1, 2]
    stages = ["admitted", "started", "dispatched", "first_step", "engine_done", "encoded", "journaled", "finished"]
    stages.append("client")  # "admitted": from the request's arrival at the gateway
    (warmup,) = levels[0].pop("warmup_requests")  # one by default, run alone before the levels, reported apart
    assert list(warmup["stages_ms"]) == stages and warmup["gateway_overhead_ms"] > 0
    assert "warmup_requests" not in levels[1]
    for level in levels:
        assert level["completed"] == level["concurrency"] and not level["errors"]
        assert level["latency_s"]["max"] <= level["all_done_s"]
        assert len(level["requests"]) == level["concurrency"]
        for request in level["requests"]:
            assert list(request["stages_ms"]) == stages and min(request["stages_ms"].values()) >= 0
            # The stages add up to the client's latency; the service's total lies within it.
            assert sum(request["stages_ms"].values()) == pytest.approx(request["latency_ms"], abs=1)
            assert 0 < request["service"]["total_ms"] < request["latency_ms"]
            overhead_ms = request["latency_ms"] - request["service"]["total_ms"]
            assert request["gateway_overhead_ms"] == pytest.approx(overhead_ms, abs=0.1)
        assert list(level["stages_ms_p50"]) == stages
        assert set(level["service_ms_p50"]) == {"queue_ms", "first_output_ms", "total_ms"}
        assert level["gateway_overhead_ms"]["p50"] <= level["gateway_overhead_ms"]["max"]
        assert 0 < level["gateway_overhead_pct"]["p50"] <= level["gateway_overhead_pct"]["max"]
        # Found through /ready and /proc: this process, whose REST port serves the diffusion metrics, off CUDA.
        assert level["gpu_peak_mib"] == {"skipped": "the diffusion service does not run on CUDA"}
    path = write(tmp_path, "diffusion", {}, levels, diffusion.check_targets(levels), "cpu test", stage_stacks(levels))
    assert json.loads(path.read_text())["levels"] == levels
    for png in (path.with_suffix(".png"), path.with_name(f"{path.stem}-stages.png")):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diffusion_targets_are_issue_20s_and_a_failed_request_misses_them():
    def level(concurrency: int, all_done_s: float, overhead_pct: float, completed: int | None = None) -> dict:
        completed = concurrency if completed is None else completed
        return {"concurrency": concurrency, "completed": completed, "all_done_s": all_done_s,
                "gateway_overhead_pct": {"p50": overhead_pct, "max": overhead_pct}}  # fmt: skip

    checks = diffusion.check_targets([level(1, 0.9, 4.0), level(4, 3.0, 9.0), level(8, 5.5, 2.0)])
    assert [(c["concurrency"], c["metric"], c["met"]) for c in checks] == [
        (1, "all_done_s", True), (1, "gateway_overhead_pct.max", True),
        (8, "all_done_s", False), (8, "gateway_overhead_pct.max", True),
    ]  # fmt: skip
    assert not any(check["met"] for check in diffusion.check_targets([level(1, 0.5, 1.0, completed=0)]))


def test_speech_targets_are_pcms_and_an_encoded_format_is_not_held_to_them():
    def level(audio_format: str) -> dict:
        return {"transport": "rest", "concurrency": 64, "format": audio_format, "audio_s_per_s": 650.0,
                "ttfp_ms": {"p95": 200.0}, "underrun_events": 0}  # fmt: skip

    checks = tts.check_targets([level("pcm")])
    assert [(c["metric"], c["met"]) for c in checks] == [
        ("audio_s_per_s", False), ("ttfp_ms.p95", True), ("underrun_events", True),
    ]  # fmt: skip
    assert tts.check_targets([level("mp3"), level("opus")]) == []


def test_an_unreachable_gateway_is_one_line_and_exit_1(tmp_path, capsys):
    args = _args(["bench", "tts", "--url", "http://127.0.0.1:9", "--out", str(tmp_path)])
    assert args.handler(args) == 1
    assert "cannot reach the Chorus gateway at http://127.0.0.1:9" in capsys.readouterr().err

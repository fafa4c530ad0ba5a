"""The step-time breakdown of `chorus bench tts`: its arithmetic on hand-made snapshots, a /metrics page parsed,
and what it says when the stack is not on this machine. (On a real stack: test_bench_e2e.py.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import aiohttp
import pytest
from ready_stub import serving_ready

from chorus.bench.breakdown import Processes, Snapshot, StepBreakdown, breakdown, parse_metrics
from chorus.bench.local_processes import cpu_s, listeners, pids_on
from chorus.runtime.processes import free_port

PAGE = """\
# HELP chorus_talker_steps_total Decode steps.
# TYPE chorus_talker_steps_total counter
chorus_talker_steps_total 100.0
# HELP chorus_vocoder_decode_seconds Wall time of one batched chunk decode.
# TYPE chorus_vocoder_decode_seconds histogram
chorus_vocoder_decode_seconds_bucket{le="0.01"} 3.0
chorus_vocoder_decode_seconds_bucket{le="+Inf"} 4.0
chorus_vocoder_decode_seconds_count 4.0
chorus_vocoder_decode_seconds_sum 0.05
chorus_vocoder_decode_seconds_created 1.7e9
# HELP chorus_rpcs_total gRPC calls handled.
# TYPE chorus_rpcs_total counter
chorus_rpcs_total{code="OK",method="Decode",service="vocoder"} 5.0
chorus_rpcs_total{code="OK",method="Generate",service="talker"} 2.0
"""


def test_a_metrics_page_becomes_sample_values_summed_over_labels_without_buckets():
    assert parse_metrics(PAGE) == {
        "chorus_talker_steps_total": 100.0,
        "chorus_vocoder_decode_seconds_count": 4.0,
        "chorus_vocoder_decode_seconds_sum": 0.05,
        "chorus_rpcs_total": 7.0,
    }
    kept = parse_metrics(PAGE, buckets_of=("chorus_vocoder_decode_seconds",))
    assert kept["chorus_vocoder_decode_seconds_bucket:0.01"] == 3.0
    assert kept["chorus_vocoder_decode_seconds_bucket:+Inf"] == 4.0


def _loop_lag(wakeups, lag_s, over_50ms) -> dict:
    return {
        "chorus_event_loop_lag_seconds_count": wakeups,
        "chorus_event_loop_lag_seconds_sum": lag_s,
        "chorus_event_loop_lag_seconds_bucket:0.05": wakeups - over_50ms,
    }


def _snapshot(
    at_s, steps, step_s, frames, prefills, prefill_s, batches, decode_s, chunks, audio_s, speech, gateway,
    gateway_lag=None, **more,
):  # fmt: skip
    metrics = more | {
        "chorus_talker_steps_total": steps,
        "chorus_talker_step_seconds_total": step_s,
        "chorus_talker_frames_total": frames,
        "chorus_talker_prefills_total": prefills,
        "chorus_talker_prefill_seconds_total": prefill_s,
        "chorus_talker_prefill_cpu_seconds_total": prefill_s * 0.6,
        "chorus_vocoder_decode_seconds_count": batches,
        "chorus_vocoder_decode_seconds_sum": decode_s,
        "chorus_vocoder_batch_size_count": batches,
        "chorus_vocoder_batch_size_sum": chunks,
        "chorus_vocoder_audio_seconds_total": audio_s,
    }
    return Snapshot(at_s, metrics, gateway_lag or _loop_lag(0, 0.0, 0), speech, gateway)


def _more(
    rows_computed, first_frames, queue_s, first_frame_s, idle_rows, ends=0, wait_s=0, tail_s=0, gcs=0, gc_s=0
) -> dict:
    return {
        "chorus_gc_pause_seconds_count": gcs,
        "chorus_gc_pause_seconds_sum": gc_s,
        "chorus_gc_pause_seconds_bucket:0.025": gcs - gcs // 100,
        "chorus_talker_rows_computed_total": rows_computed,
        "chorus_talker_queue_seconds_count": first_frames,
        "chorus_talker_queue_seconds_sum": queue_s,
        "chorus_talker_time_to_first_frame_seconds_count": first_frames,
        "chorus_talker_time_to_first_frame_seconds_sum": first_frame_s,
        "chorus_talker_steps_to_first_frame_count": first_frames,
        "chorus_talker_steps_to_first_frame_sum": 3 * first_frames,  # 3 engine steps from prefill to first frame
        "chorus_vocoder_idle_rows_total": idle_rows,
        "chorus_vocoder_end_wait_seconds_count": ends,
        "chorus_vocoder_end_wait_seconds_sum": wait_s,
        "chorus_vocoder_end_tail_seconds_count": ends,
        "chorus_vocoder_end_tail_seconds_sum": tail_s,
    }


def test_the_breakdown_of_a_level_is_the_deltas_between_its_snapshots():
    # 10 s of wall: 1000 steps of 6 ms carrying 16 frames each, 40 prefills of 25 ms, 250 vocoder batches of
    # 8 ms carrying 4 chunks each (1000 chunks, 2 frames of 80 ms: 160 s of audio); 9 CPU s in the speech
    # process, 3 in the gateway's two workers.
    # The steps computed 20 rows each; the 40 requests waited 50 ms for their prefill and 100 ms for their first
    # frame, 3 engine steps after their prefill's; the vocoder's forwards computed 250 idle rows; the 40 streams'
    # last pieces waited 20 ms after their end of input, and their last audio came 30 ms after it; 300 garbage
    # collections stopped the speech process for 150 ms in all, 3 of them for more than 25 ms.
    # The speech process's event loop woke a task due every 25 ms 400 times, 5 ms late on average, 6 times over 50
    # ms; the gateway workers' loops 800 times in all, 1 ms late on average, never over 50 ms.
    more = _more(0, 0, 0, 0, 0, gcs=50) | _loop_lag(100, 0.1, 1)
    before = _snapshot(100.0, 500, 2.0, 4000, 10, 0.5, 100, 1.0, 300, 50.0, 20.0, 5.0, _loop_lag(20, 0.0, 0), **more)
    more = _more(20000, 40, 2.0, 4.0, 250, ends=40, wait_s=0.8, tail_s=1.2, gcs=350, gc_s=0.15) | _loop_lag(500, 2.1, 7)
    after = _snapshot(
        110.0, 1500, 8.0, 20000, 50, 1.5, 350, 3.0, 1300, 210.0, 29.0, 8.0, _loop_lag(820, 0.8, 0), **more
    )
    processes = Processes(frozenset({7}), frozenset({7}), frozenset({8, 9}))
    assert breakdown(before, after, processes) == {
        "wall_s": 10.0,
        "talker_processes": 1,
        "vocoder_processes": 1,
        "speech_processes": 1,
        "gateway_processes": 2,
        "talker_steps": 1000,
        "talker_step_ms": 6.0,
        "talker_mean_batch_size": 16.0,
        "talker_mean_rows_computed": 20.0,
        "talker_step_busy_fraction": 0.6,
        "talker_prefills": 40,
        "talker_prefill_ms_per_request": 25.0,
        "talker_prefill_cpu_ms_per_request": 15.0,
        "talker_prefill_busy_fraction": 0.1,
        "talker_queue_ms_mean": 50.0,
        "talker_first_frame_ms_mean": 100.0,
        "talker_steps_to_first_frame_mean": 3.0,
        "vocoder_batches": 250,
        "vocoder_decode_ms_per_batch": 8.0,
        "vocoder_mean_batch_size": 4.0,
        "vocoder_idle_row_fraction": 0.2,
        "vocoder_busy_fraction": 0.2,
        "vocoder_chunks": 1000,
        "vocoder_audio_s": 160.0,
        "vocoder_end_wait_ms_mean": 20.0,
        "vocoder_end_tail_ms_mean": 30.0,
        "talker_plus_vocoder_busy_fraction": 0.9,
        "speech_cpu_s_per_s": 0.9,
        "speech_cpu_ms_per_talker_step": 9.0,
        "speech_gc_collections": 300,
        "speech_gc_pause_ms": 150.0,
        "speech_gc_pauses_over_25ms": 3,
        "speech_loop_lag_ms_mean": 5.0,
        "speech_loop_lags_over_50ms": 6,
        "gateway_cpu_s_per_s": 0.3,
        "gateway_cpu_ms_per_chunk": 3.0,
        "gateway_cpu_ms_per_audio_s": 18.75,
        "gateway_loop_lag_ms_mean": 1.0,
        "gateway_loop_lags_over_50ms": 0,
    }


def test_busy_fractions_are_per_replica_and_an_idle_level_divides_by_nothing():
    before = _snapshot(0.0, 0, 0.0, 0, 0, 0.0, 0, 0.0, 0, 0.0, 1.0, 1.0)
    after = _snapshot(2.0, 100, 1.0, 100, 0, 0.0, 0, 0.0, 0, 0.0, 1.5, 1.5)
    processes = Processes(frozenset({1, 2}), frozenset({3}), frozenset({1}))
    figures = breakdown(before, after, processes)
    assert figures["talker_step_busy_fraction"] == 0.25  # 1 s busy over 2 replicas × 2 s
    assert figures["speech_processes"] == 3
    assert figures["talker_prefill_ms_per_request"] is None and figures["vocoder_decode_ms_per_batch"] is None
    assert figures["talker_prefill_cpu_ms_per_request"] is None
    assert figures["gateway_cpu_ms_per_chunk"] is None
    assert figures["talker_plus_vocoder_busy_fraction"] == 0.25
    assert "share a process" in figures["note"]


def test_a_process_is_found_by_the_port_it_listens_on_and_its_cpu_time_read():
    with socket.socket() as ipv4, socket.socket(socket.AF_INET6) as ipv6:
        ipv4.bind(("0.0.0.0", 0))
        ipv6.bind(("::1", 0))
        for sock in (ipv4, ipv6):
            sock.listen()
        mine = {(listener.port, listener.host) for listener in listeners() if listener.pid == os.getpid()}
        assert {(ipv4.getsockname()[1], "127.0.0.1"), (ipv6.getsockname()[1], "::1")} <= mine
    assert cpu_s(os.getpid()) > 0


def test_every_process_sharing_a_port_is_found():
    """Gateway workers share the REST port (SO_REUSEPORT): each of them is a gateway process."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        worker = subprocess.Popen([sys.executable, "-c", _SHARE, str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert worker.stdout.readline() == "listening\n"
            assert pids_on(port, listeners()) == {os.getpid(), worker.pid}
        finally:
            worker.kill()
            worker.wait()


_SHARE = (
    "import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1); "
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('listening', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize(
    ("rest_url", "targets", "why"),
    [
        ("http://example.invalid:8000", ["127.0.0.1:1"], "the gateway (example.invalid) is not on this machine"),
        (None, ["example.invalid:50051"], "talker example.invalid:50051 is not a process on this machine"),
    ],
)
async def test_a_stack_elsewhere_gets_a_note_instead_of_a_breakdown(rest_url, targets, why):
    async with (
        serving_ready({"talker": dict.fromkeys(targets, True), "vocoder": {}}) as url,
        aiohttp.ClientSession(url) as http,
    ):
        steps = StepBreakdown(http, rest_url or url, "127.0.0.1:1")
        await steps.start()
        assert await steps.finish() == {"skipped": why}
        await steps.close()


async def test_a_gateway_that_stopped_answering_gets_a_note_instead_of_a_breakdown():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: as a gateway gone between two levels
    async with aiohttp.ClientSession(url) as http:
        steps = StepBreakdown(http, url, "127.0.0.1:1")
        await steps.start()
        assert (await steps.finish())["skipped"].startswith("the gateway's /ready: ClientConnectorError")
        await steps.close()

"""Splitting a request's time to first audio, and the wait of a player that ran dry, at the marks its run left on the
record."""

from __future__ import annotations

import aiohttp
import pytest

from chorus.bench.metrics import RequestTiming
from chorus.bench.ttfp import (
    LATENCY_STAGES,
    STAGES,
    TALKER_STAGES,
    latency_stages,
    level_latency_stages,
    level_ttfp_stages,
    sampled,
    slowest,
    ttfp_stages,
    underrun_stages,
)
from chorus.runtime.processes import free_port


def test_the_stages_add_up_to_the_clients_ttfp():
    timeline = {"arrived_ms": -2.5, "admitted_ms": 0.0, "started_ms": 1.5, "first_frame_ms": 12.0, "first_pcm_ms": 17.5,
                "first_audio_ms": 19.0, "finished_ms": 900.0}  # fmt: skip
    split = ttfp_stages(23.0, timeline)
    assert list(split) == list(STAGES)
    expected = {"admission": 2.5, "start": 1.5, "talker": 10.5, "vocoder": 5.5, "encode_journal": 1.5, "client": 1.5}
    assert split == pytest.approx(expected)
    assert sum(split.values()) == pytest.approx(23.0)


def test_the_talkers_own_timings_split_its_stage():
    timeline = {"arrived_ms": -2.5, "admitted_ms": 0.0, "started_ms": 1.5, "talker_called_ms": 1.8,
                "talker_received_ms": 2.1, "talker_admitted_ms": 2.5, "first_frame_ms": 12.0, "first_pcm_ms": 17.5,
                "first_audio_ms": 19.0}  # fmt: skip
    timings = {"queue_ms": 2.0, "first_output_ms": 7.5, "total_ms": 900.0}
    split = ttfp_stages(23.0, timeline, timings)
    assert list(split) == list(STAGES + TALKER_STAGES)
    assert [split[stage] for stage in TALKER_STAGES] == pytest.approx([0.3, 0.3, 0.4, 2.0, 5.5, 2.0])
    assert sum(split[stage] for stage in TALKER_STAGES) == pytest.approx(split["talker"])
    assert sum(split[stage] for stage in STAGES) == pytest.approx(23.0)
    for mark in ("talker_called_ms", "talker_received_ms", "talker_admitted_ms"):  # one missing: no split
        assert list(ttfp_stages(23.0, {k: v for k, v in timeline.items() if k != mark}, timings)) == list(STAGES)


def test_the_slowest_are_the_last_twentieth_by_ttfp_at_least_one_at_most_the_sample():
    ttfps = [0.1 * (i % 7) + 0.01 * i for i in range(100)]  # not in sending order
    timings = [RequestTiming(sent_at=i, first_audio_at=i + ttfp, request_id=f"r{i}") for i, ttfp in enumerate(ttfps)]
    timings[98] = RequestTiming(sent_at=98, error="HTTP 503", request_id="r98")
    picked = slowest(timings)
    slowest_ttfps = sorted((ttfp for i, ttfp in enumerate(ttfps) if i != 98), reverse=True)[:5]
    assert [t.first_audio_at - t.sent_at for t in picked] == pytest.approx(slowest_ttfps)
    assert len(slowest(timings[:3])) == 1 and len(slowest(timings * 10)) == 32


def test_without_the_arrival_mark_the_client_keeps_the_admission_wait():
    timeline = {"admitted_ms": 0.0, "started_ms": 1.5, "first_frame_ms": 12.0, "first_pcm_ms": 17.5,
                "first_audio_ms": 19.0}  # fmt: skip
    split = ttfp_stages(23.0, timeline)
    assert "admission" not in split and split["client"] == pytest.approx(4.0)
    assert sum(split.values()) == pytest.approx(23.0)


def test_a_record_without_the_marks_gives_none():
    assert ttfp_stages(23.0, {"started_ms": 1.0, "first_frame_ms": 9.0}) is None
    assert ttfp_stages(23.0, {}) is None


def test_the_latency_stages_add_up_to_the_clients_latency():
    timeline = {"arrived_ms": -2.5, "admitted_ms": 0.0, "started_ms": 1.5, "first_frame_ms": 12.0, "first_pcm_ms": 17.5,
                "first_audio_ms": 19.0, "last_frame_ms": 850.0, "talker_done_ms": 851.0, "last_pcm_ms": 880.0,
                "finished_ms": 884.0}  # fmt: skip
    split = latency_stages(890.0, timeline)
    assert list(split) == list(LATENCY_STAGES)
    expected = {"first_frame": 14.5, "frames": 838.0, "talker_final": 1.0, "vocoder": 29.0, "finish": 4.0,
                "client": 3.5}  # fmt: skip
    assert split == pytest.approx(expected)
    assert sum(split.values()) == pytest.approx(890.0)
    del timeline["last_pcm_ms"]  # a run that failed, or was taken over, before its end
    assert latency_stages(890.0, timeline) is None


def test_the_sample_spreads_over_the_requests_with_audio_and_an_id():
    timings = [RequestTiming(sent_at=i, first_audio_at=i + 0.1, request_id=f"r{i}") for i in range(100)]
    timings[3] = RequestTiming(sent_at=3, error="HTTP 503", request_id="r3")
    timings[4] = RequestTiming(sent_at=4, first_audio_at=4.1)  # no id: the gateway did not say it
    picked = sampled(timings, size=10)
    assert len(picked) == 10
    assert all(t.error is None and t.request_id for t in picked)
    assert picked[0].request_id == "r0" and int(picked[-1].request_id[1:]) >= 80


def test_a_piece_a_player_waited_for_is_timed_from_the_first_audio():
    # Pieces of 80, 160 and 320 ms; the second (piece 1) reaches the client 300 ms after the first: 220 ms dry.
    timing = RequestTiming(0.0, 0.05, 2.0, [(0.05, 0.08), (0.35, 0.16), (0.4, 0.32)], request_id="r")
    timeline = {"first_frame_ms": 20.0, "first_pcm_ms": 30.0, "first_audio_ms": 40.0,
                "frames_1_ms": 60.0, "pcm_1_ms": 320.0, "journaled_1_ms": 330.0}  # fmt: skip
    split = underrun_stages(timing, timeline)
    assert split == pytest.approx({"frames": 20.0, "pcm": 280.0, "journaled": 290.0, "client": 300.0, "due": 80.0})
    del timeline["pcm_1_ms"]  # a run that did not mark that piece
    assert underrun_stages(timing, timeline) is None
    steady = RequestTiming(0.0, 0.05, 2.0, [(0.05, 0.08), (0.1, 0.16)], request_id="s")
    assert underrun_stages(steady, timeline) is None


async def test_records_that_cannot_be_read_skip_the_stages_and_keep_the_level():
    """A gateway that stopped answering after a level (here: nothing listens) leaves that level's stages skipped,
    with why, instead of ending the whole bench and losing the levels measured."""
    timings = [RequestTiming(sent_at=0.0, first_audio_at=0.1, finished_at=1.0, request_id="r0")]
    async with aiohttp.ClientSession(f"http://127.0.0.1:{free_port()}") as http:
        for stages in (level_ttfp_stages, level_latency_stages):
            skipped = (await stages(http, timings))["skipped"]
            assert skipped.startswith("reading request r0's record failed: ClientConnectorError")

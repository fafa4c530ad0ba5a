"""Where a level's time to first audio went, from the records of a sample of its requests.

A speech run marks on its record when the frames of its first audio came from the talker (`first_frame`), their
PCM from the vocoder (`first_pcm`) and its first bytes were journaled (`first_audio`); with the record's arrival,
admission and start, and the client's TTFP, they split each sampled request's TTFP into:
  admission       the request reached the gateway → admitted (its wait for a backend slot; absent from the records
                  of a gateway that does not mark `arrived`)
  start           admission → the run started (request record, run broker)
  talker          → first frames at the gateway (talker gRPC, queue, prefill, first decode step, back)
  vocoder         → their PCM at the gateway (vocoder gRPC, first chunk's decode, back)
  encode_journal  → first bytes journaled (encoding, the journal's Redis write)
  client          the rest of the client's TTFP: sending the request, the bytes after the journal
Where the record has the talker's own timings (`usage.timings` of its first segment's stream, and the
`talker_received` and `talker_admitted` marks, on the talker's clock: exact where the gateway and the talker share a
host, as in the bench) and the gateway's `talker_called`, `talker` is split further into (TALKER_STAGES, which add
up to it):
  talker_call         the gateway's way to opening the talker call (the run's segments, its tasks, its event loop)
  talker_accept       → the talker's handler (gRPC, the talker's intake of new calls)
  talker_submit       → admitted to the talker engine (its first message read, its prompt built)
  talker_queue        its wait in the engine for its prefill
  talker_first_frame  → its first frame made (the prefill, the decode steps to the first frame)
  talker_out          the frame's way back to the gateway (the talker's event loop, gRPC, the gateway's loop)
`slowest_ttfp_stages` splits the level's slowest 5 % alike (those past its TTFP p95): where its tail comes from.

For the next few pieces a run marks when each one's frames came (`frames_<piece>`), its PCM (`pcm_<piece>`) and
when it was journaled (`journaled_<piece>`): where a player ran dry, they say which part made the piece it waited
for late (`underrun_stages`).

At its end a run marks when its last frames came (`last_frame`), the talker's Final (`talker_done`) and the last
PCM (`last_pcm`); with the record's end they split each sampled request's latency (to its last byte) into:
  first_frame     the request reached the gateway → its first frames there (the TTFP stages up to `talker`)
  frames          → its last frames there (the talker's decode)
  talker_final    → the talker's Final
  vocoder         → the last PCM (the last pieces' decodes, which a stream's end makes urgent)
  finish          → the record's end (encoder flush, end of the journal, the record's transition)
  client          the rest of the client's latency: sending the request, the end reaching the client
A closed-loop client sends its next request only after the last byte, so the time after the last frame leaves a
talker slot empty (`latency_stages`).
"""

from __future__ import annotations

import statistics

import aiohttp

from chorus.bench.metrics import RequestTiming, underruns

SAMPLE = 32  # requests read per level, spread over it
STAGES = ("admission", "start", "talker", "vocoder", "encode_journal", "client")
TALKER_STAGES = ("talker_call", "talker_accept", "talker_submit", "talker_queue", "talker_first_frame", "talker_out")
_TALKER_MARKS = ("talker_called_ms", "talker_received_ms", "talker_admitted_ms")
_MARKS = ("started_ms", "first_frame_ms", "first_pcm_ms", "first_audio_ms")
LATENCY_STAGES = ("first_frame", "frames", "talker_final", "vocoder", "finish", "client")
_END_MARKS = ("first_frame_ms", "last_frame_ms", "talker_done_ms", "last_pcm_ms", "finished_ms")


def ttfp_stages(
    ttfp_ms: float, timeline_ms: dict[str, float], talker_timings: dict[str, float] | None = None
) -> dict[str, float] | None:
    """One request's TTFP split into STAGES, from its record's timeline (ms since admission), and `talker` into
    TALKER_STAGES too with the talker's own timings (`usage.timings`); None without the marks (a gateway that does
    not set them, a run that failed before audio). Without `arrived_ms` the split has no `admission`, and `client`
    holds that wait too."""
    if any(mark not in timeline_ms for mark in _MARKS):
        return None
    started, first_frame, first_pcm, first_audio = (timeline_ms[mark] for mark in _MARKS)
    admission = -timeline_ms["arrived_ms"] if "arrived_ms" in timeline_ms else None
    parts = (
        admission,
        started,
        first_frame - started,
        first_pcm - first_frame,
        first_audio - first_pcm,
        ttfp_ms - first_audio - (admission or 0.0),
    )
    split = {stage: part for stage, part in zip(STAGES, parts, strict=True) if part is not None}
    if talker_timings and all(mark in timeline_ms for mark in _TALKER_MARKS):
        queue_ms, first_output_ms = talker_timings["queue_ms"], talker_timings["first_output_ms"]
        called, received, admitted = (timeline_ms[mark] - started for mark in _TALKER_MARKS)
        talker_parts = (
            called,
            received - called,
            admitted - received,
            queue_ms,
            first_output_ms - queue_ms,
            split["talker"] - admitted - first_output_ms,
        )
        split |= dict(zip(TALKER_STAGES, talker_parts, strict=True))
    return split


def latency_stages(latency_ms: float, timeline_ms: dict[str, float]) -> dict[str, float] | None:
    """One request's latency split into LATENCY_STAGES, from its record's timeline (ms since admission); None
    without the marks (a run that failed, was taken over or ran on a gateway that does not set them). Without
    `arrived_ms`, `client` holds the wait for admission too."""
    if any(mark not in timeline_ms for mark in _END_MARKS):
        return None
    first_frame, last_frame, talker_done, last_pcm, finished = (timeline_ms[mark] for mark in _END_MARKS)
    admission = -timeline_ms.get("arrived_ms", 0.0)
    parts = (
        admission + first_frame,
        last_frame - first_frame,
        talker_done - last_frame,
        last_pcm - talker_done,
        finished - last_pcm,
        latency_ms - finished - admission,
    )
    return dict(zip(LATENCY_STAGES, parts, strict=True))


def _with_audio(timings: list[RequestTiming]) -> list[RequestTiming]:
    """The requests with audio and an id (whose records can be read and split)."""
    return [t for t in timings if t.error is None and t.first_audio_at is not None and t.request_id]


def sampled(timings: list[RequestTiming], size: int = SAMPLE) -> list[RequestTiming]:
    """Up to `size` requests with audio and an id, evenly spread over the level."""
    usable = _with_audio(timings)
    step = max(1, len(usable) // size)
    return usable[::step][:size]


def slowest(timings: list[RequestTiming], share: float = 0.05, most: int = SAMPLE) -> list[RequestTiming]:
    """The slowest `share` of the requests with audio and an id, by TTFP (at least one, at most `most`)."""
    usable = sorted(_with_audio(timings), key=lambda t: t.first_audio_at - t.sent_at, reverse=True)
    return usable[: min(most, max(1, round(share * len(usable))))]


def underrun_stages(timing: RequestTiming, timeline_ms: dict[str, float]) -> dict[str, float] | None:
    """Where the piece a request's player first ran dry waiting for was, in ms after the request's first audio:
    when its frames came from the talker (`frames`), its PCM from the vocoder (`pcm`), it was journaled
    (`journaled`; these three on the gateway's clock, from `first_audio`), the client got it (`client`; on the
    client's clock, from the first piece), against when the player needed it (`due`: the audio before it). None
    without an underrun, or where the run has no marks for that piece."""
    events = underruns(timing.arrivals)
    if not events or "first_audio_ms" not in timeline_ms:
        return None
    piece = events[0][0]
    marks = {stage: timeline_ms.get(f"{stage}_{piece}_ms") for stage in ("frames", "pcm", "journaled")}
    if None in marks.values():
        return None
    split = {stage: at_ms - timeline_ms["first_audio_ms"] for stage, at_ms in marks.items()}
    split["client"] = (timing.arrivals[piece][0] - timing.arrivals[0][0]) * 1000
    split["due"] = sum(duration_s for _, duration_s in timing.arrivals[:piece]) * 1000
    return split


async def _record(http: aiohttp.ClientSession, request_id: str) -> dict | None:
    async with http.get(f"/v1/requests/{request_id}") as reply:
        if reply.status != 200:
            return None
        return await reply.json()


async def _level_stages(
    http: aiohttp.ClientSession,
    timings: list[RequestTiming],
    split_of,
    stages: tuple[str, ...],
    why_none: str,
    pick=sampled,
) -> dict:
    """Medians in ms of `split_of(timing, record)` over the requests `pick` chooses (a sample spread over the
    level) whose records have the marks it needs, or {"skipped": why_none}; {"skipped": why} when the records
    cannot be read (the level's figures stand without them)."""
    splits = []
    for timing in pick(timings):
        try:
            record = await _record(http, timing.request_id)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return {"skipped": f"reading request {timing.request_id}'s record failed: {type(exc).__name__}: {exc}"}
        if record is not None and (split := split_of(timing, record)) is not None:
            splits.append(split)
    if not splits:
        return {"skipped": why_none}
    return {"requests": len(splits), "p50_ms": _medians(splits, stages)}


async def level_ttfp_stages(http: aiohttp.ClientSession, timings: list[RequestTiming], pick=sampled) -> dict:
    """Medians of the TTFP stages in ms of the requests `pick` chooses (`sampled`, `slowest`), or {"skipped": why}."""

    def split_of(timing: RequestTiming, record: dict) -> dict[str, float] | None:
        ttfp_ms = (timing.first_audio_at - timing.sent_at) * 1000
        return ttfp_stages(ttfp_ms, record.get("timeline") or {}, (record.get("usage") or {}).get("timings"))

    why = "no sampled request's record has the first-audio marks"
    return await _level_stages(http, timings, split_of, STAGES + TALKER_STAGES, why, pick)


async def level_latency_stages(http: aiohttp.ClientSession, timings: list[RequestTiming]) -> dict:
    """Medians of the sampled requests' latency stages in ms, or {"skipped": why}."""

    def split_of(timing: RequestTiming, record: dict) -> dict[str, float] | None:
        return latency_stages((timing.finished_at - timing.sent_at) * 1000, record.get("timeline") or {})

    return await _level_stages(http, timings, split_of, LATENCY_STAGES, "no sampled request's record has the end marks")


async def level_underrun_stages(http: aiohttp.ClientSession, timings: list[RequestTiming]) -> dict:
    """Medians of `underrun_stages` over a sample of the requests whose players ran dry, or {"skipped": why}."""
    dry = [timing for timing in timings if underruns(timing.arrivals)]
    why = "no player ran dry" if not dry else "no sampled record marks the piece waited for"

    def split_of(timing: RequestTiming, record: dict) -> dict[str, float] | None:
        return underrun_stages(timing, record.get("timeline") or {})

    return await _level_stages(http, dry, split_of, ("frames", "pcm", "journaled", "client", "due"), why)


def _medians(splits: list[dict[str, float]], stages: tuple[str, ...]) -> dict[str, float]:
    medians = {}
    for stage in stages:
        if values := [split[stage] for split in splits if stage in split]:
            medians[stage] = round(statistics.median(values), 2)
    return medians

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
"""

from __future__ import annotations

import statistics

import aiohttp

from chorus.bench.metrics import RequestTiming

SAMPLE = 32  # requests read per level, spread over it
STAGES = ("admission", "start", "talker", "vocoder", "encode_journal", "client")
_MARKS = ("started_ms", "first_frame_ms", "first_pcm_ms", "first_audio_ms")


def ttfp_stages(ttfp_ms: float, timeline_ms: dict[str, float]) -> dict[str, float] | None:
    """One request's TTFP split into STAGES, from its record's timeline (ms since admission); None without the
    marks (a gateway that does not set them, a run that failed before audio). Without `arrived_ms` the split has
    no `admission`, and `client` holds that wait too."""
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
    return {stage: part for stage, part in zip(STAGES, parts, strict=True) if part is not None}


def sampled(timings: list[RequestTiming], size: int = SAMPLE) -> list[RequestTiming]:
    """Up to `size` requests with audio and an id, evenly spread over the level."""
    usable = [t for t in timings if t.error is None and t.first_audio_at is not None and t.request_id]
    step = max(1, len(usable) // size)
    return usable[::step][:size]


async def level_ttfp_stages(http: aiohttp.ClientSession, timings: list[RequestTiming]) -> dict:
    """Medians of the sampled requests' TTFP stages in ms, or {"skipped": why}."""
    splits = []
    for timing in sampled(timings):
        async with http.get(f"/v1/requests/{timing.request_id}") as reply:
            if reply.status != 200:
                continue
            record = await reply.json()
        split = ttfp_stages((timing.first_audio_at - timing.sent_at) * 1000, record.get("timeline") or {})
        if split is not None:
            splits.append(split)
    if not splits:
        return {"skipped": "no sampled request's record has the first-audio marks"}
    medians = {}
    for stage in STAGES:
        if values := [split[stage] for split in splits if stage in split]:
            medians[stage] = round(statistics.median(values), 2)
    return {"requests": len(splits), "p50_ms": medians}

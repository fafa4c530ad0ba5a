"""What a benchmark reports about its requests: percentiles, and underruns of a simulated real-time player.

Pure functions over client-side timings (seconds, `time.perf_counter`), so they are tested on hand-made
timelines. Definitions follow vLLM-Omni's: TTFP is the time from sending a request to its first non-empty
audio bytes; RTF is end-to-end latency over the audio's duration.
"""

from __future__ import annotations

import collections
import dataclasses
import math

UNDERRUN_THRESHOLD_S = 0.1


@dataclasses.dataclass
class RequestTiming:
    sent_at: float
    first_audio_at: float | None = None
    finished_at: float | None = None
    # (arrival time, seconds of audio in that piece) for every non-empty piece, in order
    arrivals: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    error: str | None = None
    error_message: str | None = None  # what the stack answered with the error, to tell why
    request_id: str | None = None  # the gateway's, to read the request's record after the level

    @property
    def audio_s(self) -> float:
        return sum(duration for _, duration in self.arrivals)


ERROR_EXAMPLES = 3  # per kind of error and level


def percentile(values: list[float], q: float) -> float:
    """The `q`-th percentile (0–100) with linear interpolation between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def underruns(
    arrivals: list[tuple[float, float]], threshold_s: float = UNDERRUN_THRESHOLD_S
) -> list[tuple[int, float]]:
    """Each time a player that starts at the first piece and plays in real time runs dry for more than
    `threshold_s`: (the index of the piece it waited for, how long it waited in s). After running dry it waits for
    the next piece and plays on (its clock shifts by the wait)."""
    if not arrivals:
        return []
    play_started_at, buffered_s, events = arrivals[0][0], 0.0, []
    for index, (arrived_at, duration_s) in enumerate(arrivals):
        deficit_s = (arrived_at - play_started_at) - buffered_s
        if deficit_s > threshold_s:
            events.append((index, deficit_s))
        if deficit_s > 0:
            play_started_at += deficit_s
        buffered_s += duration_s
    return events


def summarize(timings: list[RequestTiming], wall_s: float) -> dict:
    """Per-level figures: TTFP and latency percentiles (ms), RTF, audio seconds per wall second, underruns."""
    done = [t for t in timings if t.error is None and t.first_audio_at is not None]
    ttfp_ms = [(t.first_audio_at - t.sent_at) * 1000 for t in done]
    latency_ms = [(t.finished_at - t.sent_at) * 1000 for t in done]
    rtf = [(t.finished_at - t.sent_at) / t.audio_s for t in done if t.audio_s > 0]
    dry = [underruns(t.arrivals) for t in done]
    events = [event for request in dry for event in request]
    errors: dict[str, int] = {}
    error_examples: dict[str, list[dict]] = {}  # the first few of each kind: a count alone does not say why
    for timing in timings:
        if timing.error is not None:
            errors[timing.error] = errors.get(timing.error, 0) + 1
            examples = error_examples.setdefault(timing.error, [])
            if len(examples) < ERROR_EXAMPLES:
                examples.append({"request_id": timing.request_id, "message": timing.error_message})
    return {
        "requests": len(timings),
        "completed": len(done),
        "errors": errors,
        "error_examples": error_examples,
        "ttfp_ms": {f"p{q}": _rounded(percentile(ttfp_ms, q)) for q in (50, 90, 95, 99)},
        "latency_ms": {f"p{q}": _rounded(percentile(latency_ms, q)) for q in (50, 90, 99)},
        "rtf": {f"p{q}": _rounded(percentile(rtf, q), 4) for q in (50, 99)},
        "audio_s": round(sum(t.audio_s for t in done), 3),
        "audio_s_per_s": round(sum(t.audio_s for t in done) / wall_s, 2) if wall_s > 0 else math.nan,
        "requests_with_underruns": sum(1 for request in dry if request),
        "underrun_events": len(events),
        # Where players ran dry: the index of the piece each waited for (0 is a stream's first audio), and for how long.
        "underruns_by_piece": {
            str(index): count for index, count in sorted(collections.Counter(i for i, _ in events).items())
        },
        "underrun_wait_ms": {f"p{q}": _rounded(percentile([wait * 1000 for _, wait in events], q)) for q in (50, 99)},
        "wall_s": round(wall_s, 3),
    }


def steady_quarters(timings: list[RequestTiming], started_at: float) -> list[dict]:
    """A level's steady part — from its start to its last request sent, while all its streams were in flight —
    in four equal windows: the audio seconds that arrived in each per second, and the TTFP p95 of the requests
    sent in it. A sustained run holds its figures when its quarters agree. Empty when every request was sent
    at once (no more requests than streams)."""
    window_s = (max(t.sent_at for t in timings) - started_at) / 4
    if window_s <= 0:
        return []
    quarters = []
    for index in range(4):
        low, high = started_at + index * window_s, started_at + (index + 1) * window_s
        audio_s = sum(seconds for t in timings for at, seconds in t.arrivals if low <= at < high)
        ttfp_ms = [
            (t.first_audio_at - t.sent_at) * 1000
            for t in timings
            if t.error is None and t.first_audio_at is not None and low <= t.sent_at < high
        ]
        p95 = _rounded(percentile(ttfp_ms, 95))
        quarters.append({"audio_s_per_s": round(audio_s / window_s, 2), "ttfp_p95_ms": p95})
    return quarters


def _rounded(value: float, digits: int = 1) -> float | None:
    return None if math.isnan(value) else round(value, digits)

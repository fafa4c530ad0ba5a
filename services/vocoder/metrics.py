"""Vocoder metrics: decode time per batched chunk, batch size and idle rows, audio produced, a stream's time after
its end of input, live streams and state."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DECODE_SECONDS = Histogram(
    "chorus_vocoder_decode_seconds",
    "Wall time of one batched chunk decode.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
BATCH_SIZE = Histogram(
    "chorus_vocoder_batch_size", "Streams decoded together in one forward.", buckets=(1, 2, 4, 8, 16, 32, 64, 128)
)
IDLE_ROWS = Counter(
    "chorus_vocoder_idle_rows",
    "Rows a batched forward computed for no stream: its batch padded up to a captured graph's size.",
)
_END_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
END_WAIT_SECONDS = Histogram(
    "chorus_vocoder_end_wait_seconds",
    "A stream's end of input to the start of its first decode after it (what its last pieces waited for).",
    buckets=_END_BUCKETS,
)
END_TAIL_SECONDS = Histogram(
    "chorus_vocoder_end_tail_seconds",
    "A stream's end of input to its last audio decoded, for streams with frames still to decode at their end.",
    buckets=_END_BUCKETS,
)
AUDIO_SECONDS = Counter("chorus_vocoder_audio_seconds", "Seconds of audio decoded (rate = audio seconds per second).")
LIVE_STREAMS = Gauge("chorus_vocoder_live_streams", "Decode streams holding decoder state.")
STATE_BYTES = Gauge("chorus_vocoder_state_bytes", "Decoder state memory held by live streams.")

"""Talker metrics, read from the engine's counters at scrape time: steps, step time, frames, batch, queue, KV
blocks, preemptions."""

from __future__ import annotations

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1, 2, 5)
QUEUE_SECONDS = Histogram(
    "chorus_talker_queue_seconds", "Request admitted → its prefill started (waiting for a slot or for text).",
    buckets=_LATENCY_BUCKETS,
)  # fmt: skip
FIRST_FRAME_SECONDS = Histogram(
    "chorus_talker_time_to_first_frame_seconds", "Request admitted → its first frame handed out.",
    buckets=_LATENCY_BUCKETS,
)  # fmt: skip
# Whether a slow first frame waited for more engine steps than the pipeline needs (2: the prefill's step, then the
# one that collects its first decode step) or for longer ones.
STEPS_TO_FIRST_FRAME = Histogram(
    "chorus_talker_steps_to_first_frame", "Engine steps from a request's prefill to its first frame (2 at best).",
    buckets=(2, 3, 4, 6, 8, 12, 16, 24, 32),
)  # fmt: skip


class TalkerCollector(Collector):
    def __init__(self, engine) -> None:
        self.engine = engine

    def collect(self):
        stats, load = self.engine.stats, self.engine.load()
        yield CounterMetricFamily("chorus_talker_steps", "Decode steps (one frame for every live stream).", stats.steps)
        yield CounterMetricFamily(
            "chorus_talker_step_seconds",
            "Time in decode steps (rate / steps rate = step time).",
            stats.step_ms_total / 1e3,
        )
        yield CounterMetricFamily(
            "chorus_talker_frames", "Codec frames produced (12.5 per audio second).", stats.frames
        )
        yield CounterMetricFamily(
            "chorus_talker_rows_computed",
            "Rows the decode steps computed (against frames: idle slots below live ones, padding up to a graph's "
            "batch size).",
            stats.rows_computed,
        )
        yield CounterMetricFamily("chorus_talker_prefills", "Requests prefilled.", stats.prefills)
        yield CounterMetricFamily(
            "chorus_talker_prefill_seconds",
            "Engine-thread time in batched prefills (the GPU runs the decode steps already launched meanwhile).",
            stats.prefill_ms_total / 1e3,
        )
        yield CounterMetricFamily(
            "chorus_talker_prefill_cpu_seconds",
            "The engine thread's CPU time in batched prefills (against chorus_talker_prefill_seconds, the rest it "
            "waited: for the GIL, or in a blocking call).",
            stats.prefill_cpu_ms_total / 1e3,
        )
        yield GaugeMetricFamily("chorus_talker_last_step_seconds", "Latest decode step time.", stats.last_step_ms / 1e3)
        yield GaugeMetricFamily("chorus_talker_batch_size", "Streams in the latest decode step.", stats.last_batch_size)
        yield GaugeMetricFamily("chorus_talker_live_streams", "Streams holding a KV-cache slot.", load.live_streams)
        yield GaugeMetricFamily("chorus_talker_free_slots", "KV-cache slots free.", load.free_slots)
        yield GaugeMetricFamily(
            "chorus_talker_queue_depth", "Requests waiting for a slot or for text.", load.queue_depth
        )
        yield GaugeMetricFamily(
            "chorus_talker_kv_free_blocks", "KV-cache blocks (64 positions) free.", self.engine.kv_blocks.num_free
        )
        yield CounterMetricFamily(
            "chorus_talker_preemptions",
            "Streams taken off their slot for lack of KV blocks (each resumes where it stopped).",
            stats.preemptions,
        )


def register(engine) -> TalkerCollector:
    collector = TalkerCollector(engine)
    REGISTRY.register(collector)
    return collector


def unregister(collector: TalkerCollector) -> None:
    REGISTRY.unregister(collector)

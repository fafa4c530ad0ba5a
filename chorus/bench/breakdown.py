"""Where a bench level's time went, per level of `chorus bench tts`: talker decode steps and prefills, vocoder
decodes, how busy each kept its process, and the host CPU of the speech process(es) and the gateway.

The figures are deltas between two snapshots, one just before the level and one just after it: the speech
services' Prometheus counters (talker steps, step and prefill seconds, the prefills' engine-thread CPU seconds,
frames, rows computed, prefills, the queue and first-frame time histograms and the engine steps from a prefill to
its first frame (`talker_steps_to_first_frame_mean`, 2 at best: a slow first frame waited for more steps, or for
longer ones); the vocoder's decode seconds and batch-size histograms, idle rows, audio seconds, and its streams' time
after their end of input: to their first decode since (`vocoder_end_wait_ms_mean`) and to their last audio
(`vocoder_end_tail_ms_mean`); their garbage collections and the time those held the GIL; how late their event
loops ran what was due, and the gateway's) and each process's CPU time from /proc. So the bench must run on the
stack's machine; otherwise (a remote gateway or backend) the level says why it has none.

`talker_plus_vocoder_busy_fraction` is the sum of the talker's busy fractions (steps and prefills) and the
vocoder's. When the two share a GPU it bounds their overlap, it does not measure it: near 1 they may simply
take turns, over 1 they must have run at the same time for at least the excess.

The processes are found from the gateway's `/ready`: its talker and vocoder targets' ports lead to the
processes listening on them (one process when the speech services share one), the REST port to the gateway's
(every worker: they share the port). A service's /metrics is on another port of its process; the first of its
other ports that answers with talker or vocoder metrics is the one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from chorus.bench.chaos import SPEECH_BACKENDS
from chorus.bench.local_processes import Listener, cpu_s, is_local, listeners, pids_on
from chorus.bench.memory import CUDA_GAUGES, MemoryWatch
from chorus.runtime.gc_pauses import METRIC as GC_PAUSES
from chorus.runtime.loop_lag import METRIC as LOOP_LAG

SPEECH_METRICS = ("chorus_talker_", "chorus_vocoder_")
LONG_GC_PAUSE_S = 0.025  # one of `gc_pauses.BUCKETS_S`
LONG_LOOP_LAG_S = 0.05  # one of `loop_lag.BUCKETS_S`
COUNTERS = ("_total", "_sum", "_count")  # samples that only grow (counters, histograms), unlike gauges


def parse_metrics(text: str, buckets_of: tuple[str, ...] = ()) -> dict[str, float]:
    """A /metrics page as {sample name: value}, summed over label sets; histogram buckets left out, but those of
    the histograms named in `buckets_of`, as `<name>_bucket:<le>`."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_bucket") and name.removesuffix("_bucket") in buckets_of:
                name = f"{name}:{sample.labels['le']}"
            elif name.endswith(("_bucket", "_created")):
                continue
            values[name] = values.get(name, 0.0) + sample.value
    return values


@dataclasses.dataclass(frozen=True)
class Processes:
    talker_pids: frozenset[int]
    vocoder_pids: frozenset[int]
    gateway_pids: frozenset[int]

    @property
    def speech_pids(self) -> frozenset[int]:
        return self.talker_pids | self.vocoder_pids


@dataclasses.dataclass(frozen=True)
class Snapshot:
    at_s: float  # time.perf_counter()
    metrics: dict[str, float]  # the speech services' counters, summed over their processes
    gateway_metrics: dict[str, float]  # the gateway's event-loop lag histogram, summed over its workers
    speech_cpu_s: float
    gateway_cpu_s: float


def breakdown(before: Snapshot, after: Snapshot, processes: Processes) -> dict:
    """The level's figures from the snapshots around it. Busy fractions are per process (a replica's seconds
    busy over the wall seconds); a ratio with nothing to divide by is None."""
    wall_s = after.at_s - before.at_s
    delta, gateway_delta = _delta(before.metrics, after.metrics), _delta(before.gateway_metrics, after.gateway_metrics)
    steps = delta.get("chorus_talker_steps_total", 0.0)
    step_s = delta.get("chorus_talker_step_seconds_total", 0.0)
    prefills = delta.get("chorus_talker_prefills_total", 0.0)
    prefill_s = delta.get("chorus_talker_prefill_seconds_total", 0.0)
    prefill_cpu_s = delta.get("chorus_talker_prefill_cpu_seconds_total", 0.0)
    batches = delta.get("chorus_vocoder_decode_seconds_count", 0.0)
    decode_s = delta.get("chorus_vocoder_decode_seconds_sum", 0.0)
    chunks = delta.get("chorus_vocoder_batch_size_sum", 0.0)  # one per stream in each batch
    audio_s = delta.get("chorus_vocoder_audio_seconds_total", 0.0)
    idle_rows = delta.get("chorus_vocoder_idle_rows_total", 0.0)
    speech_cpu_s = after.speech_cpu_s - before.speech_cpu_s
    gateway_cpu_s = after.gateway_cpu_s - before.gateway_cpu_s
    talker_wall_s = wall_s * len(processes.talker_pids)
    vocoder_wall_s = wall_s * len(processes.vocoder_pids)
    busy = (_ratio(step_s, talker_wall_s), _ratio(prefill_s, talker_wall_s), _ratio(decode_s, vocoder_wall_s))
    figures = {
        "wall_s": round(wall_s, 3),
        "talker_processes": len(processes.talker_pids),
        "vocoder_processes": len(processes.vocoder_pids),
        "speech_processes": len(processes.speech_pids),
        "gateway_processes": len(processes.gateway_pids),
        "talker_steps": round(steps),
        "talker_step_ms": _ratio(step_s * 1e3, steps),
        "talker_mean_batch_size": _ratio(delta.get("chorus_talker_frames_total", 0.0), steps),
        "talker_mean_rows_computed": _ratio(delta.get("chorus_talker_rows_computed_total", 0.0), steps),
        "talker_step_busy_fraction": busy[0],
        "talker_prefills": round(prefills),
        "talker_prefill_ms_per_request": _ratio(prefill_s * 1e3, prefills),
        "talker_prefill_cpu_ms_per_request": _ratio(prefill_cpu_s * 1e3, prefills),
        "talker_prefill_busy_fraction": busy[1],
        "talker_queue_ms_mean": _mean_ms(delta, "chorus_talker_queue_seconds"),
        "talker_first_frame_ms_mean": _mean_ms(delta, "chorus_talker_time_to_first_frame_seconds"),
        "talker_steps_to_first_frame_mean": _ratio(
            delta.get("chorus_talker_steps_to_first_frame_sum", 0.0),
            delta.get("chorus_talker_steps_to_first_frame_count", 0.0),
        ),
        "vocoder_batches": round(batches),
        "vocoder_decode_ms_per_batch": _ratio(decode_s * 1e3, batches),
        "vocoder_mean_batch_size": _ratio(chunks, batches),
        "vocoder_idle_row_fraction": _ratio(idle_rows, chunks + idle_rows),
        "vocoder_busy_fraction": busy[2],
        "vocoder_chunks": round(chunks),
        "vocoder_audio_s": round(audio_s, 3),
        "vocoder_end_wait_ms_mean": _mean_ms(delta, "chorus_vocoder_end_wait_seconds"),
        "vocoder_end_tail_ms_mean": _mean_ms(delta, "chorus_vocoder_end_tail_seconds"),
        "talker_plus_vocoder_busy_fraction": None if None in busy else round(sum(busy), 3),
        "speech_cpu_s_per_s": _ratio(speech_cpu_s, wall_s),
        "speech_cpu_ms_per_talker_step": _ratio(speech_cpu_s * 1e3, steps),
        # Collections stop every thread of their process: one long pause stalls all of its streams at once.
        "speech_gc_collections": round(delta.get(f"{GC_PAUSES}_count", 0.0)),
        "speech_gc_pause_ms": round(delta.get(f"{GC_PAUSES}_sum", 0.0) * 1e3, 1),
        "speech_gc_pauses_over_25ms": round(
            delta.get(f"{GC_PAUSES}_count", 0.0) - delta.get(f"{GC_PAUSES}_bucket:{LONG_GC_PAUSE_S}", 0.0)
        ),
        # A late event loop delays every stream of its process: its messages, and new requests before they start.
        **_loop_lag_figures("speech", delta),
        "gateway_cpu_s_per_s": _ratio(gateway_cpu_s, wall_s),
        "gateway_cpu_ms_per_chunk": _ratio(gateway_cpu_s * 1e3, chunks),
        "gateway_cpu_ms_per_audio_s": _ratio(gateway_cpu_s * 1e3, audio_s),
        **_loop_lag_figures("gateway", gateway_delta),
    }
    if processes.gateway_pids & processes.speech_pids:
        figures["note"] = "the gateway and the speech services share a process: their CPU figures overlap"
    return figures


def _delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: value - before.get(name, 0.0) for name, value in after.items()}


def _loop_lag_figures(processes: str, delta: dict[str, float]) -> dict[str, float | None]:
    """The mean lateness of the processes' event loops over the level, and how often one was over 50 ms late."""
    wakeups = delta.get(f"{LOOP_LAG}_count", 0.0)
    return {
        f"{processes}_loop_lag_ms_mean": _mean_ms(delta, LOOP_LAG),
        f"{processes}_loop_lags_over_50ms": round(wakeups - delta.get(f"{LOOP_LAG}_bucket:{LONG_LOOP_LAG_S}", 0.0)),
    }


def _mean_ms(delta: dict[str, float], histogram: str) -> float | None:
    return _ratio(delta.get(f"{histogram}_sum", 0.0) * 1e3, delta.get(f"{histogram}_count", 0.0))


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator > 0 else None


class Skipped(Exception):
    """Why a level has no breakdown."""


class StepBreakdown:
    """`await start()` just before a level, `await finish()` just after it: the level's breakdown, or
    {"skipped": why}. The processes are found again for every level (a restarted one has new counters)."""

    def __init__(self, http: aiohttp.ClientSession, rest_url: str, grpc_target: str) -> None:
        self.http = http  # the gateway's REST API
        self.rest_url = urlsplit(rest_url)
        self.grpc_port = int(grpc_target.rsplit(":", 1)[1])
        self.scraper = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        self.metrics_urls: dict[int, str] = {}  # pid → its /metrics
        self.started: tuple[Processes, Snapshot] | str | None = None
        self.memory: MemoryWatch | None = None

    async def close(self) -> None:
        await self.scraper.close()

    async def start(self) -> None:
        try:
            processes = await self._find()
            self.started = (processes, await self._snapshot(processes))
        except Skipped as exc:
            self.started = str(exc)
            return
        groups = {"speech": processes.speech_pids, "gateway": processes.gateway_pids}
        self.memory = MemoryWatch(groups, lambda: self._cuda_gauges(processes))
        self.memory.start()

    async def finish(self) -> dict:
        if isinstance(self.started, str):
            return {"skipped": self.started}
        processes, before = self.started
        memory = await self.memory.stop()
        try:
            after = await self._snapshot(processes)
        except Skipped as exc:
            return {"skipped": str(exc)}
        if any(after.metrics.get(name, 0.0) < value for name, value in before.metrics.items()):
            return {"skipped": "a speech service's counters went back during the level (it restarted)"}
        return breakdown(before, after, processes) | {"memory_mib": memory}

    async def _find(self) -> Processes:
        if not is_local(self.rest_url.hostname or ""):
            raise Skipped(f"the gateway ({self.rest_url.hostname}) is not on this machine")
        try:
            async with self.http.get("/ready") as reply:
                backends = (await reply.json())["backends"]
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Skipped(f"the gateway's /ready: {type(exc).__name__}: {exc}") from exc
        found = await asyncio.to_thread(listeners)
        pids = {backend: local_pids(backend, list(backends.get(backend, {})), found) for backend in SPEECH_BACKENDS}
        gateway_pids = pids_on(self.rest_url.port or 80, found)
        if not gateway_pids:
            raise Skipped(f"no process of this machine listens on the gateway's REST port {self.rest_url.port}")
        processes = Processes(frozenset(pids["talker"]), frozenset(pids["vocoder"]), frozenset(gateway_pids))
        grpc_ports = {int(target.rsplit(":", 1)[1]) for backend in SPEECH_BACKENDS for target in backends[backend]}
        for pid in processes.speech_pids - self.metrics_urls.keys():
            self.metrics_urls[pid] = await self._metrics_url(pid, found, grpc_ports | {self.grpc_port})
        return processes

    async def _metrics_url(self, pid: int, found: list[Listener], grpc_ports: set[int]) -> str:
        url = await metrics_url(self.scraper, pid, found, grpc_ports, SPEECH_METRICS)
        if url is None:
            raise Skipped(f"process {pid} serves no /metrics with talker or vocoder metrics (metrics port -1?)")
        return url

    async def _speech_metrics(self, processes: Processes, wanted) -> dict[str, float]:
        """The speech processes' samples whose names `wanted(name)` accepts, summed over the processes."""
        metrics: dict[str, float] = {}
        for pid in sorted(processes.speech_pids):
            url = self.metrics_urls[pid]
            try:
                async with self.scraper.get(url) as reply:
                    reply.raise_for_status()
                    samples = parse_metrics(await reply.text(), buckets_of=(GC_PAUSES, LOOP_LAG))
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise Skipped(f"{url}: {type(exc).__name__}") from exc
            except ValueError as exc:  # a page that is not (or no longer) Prometheus text
                raise Skipped(f"{url}: unreadable metrics page ({exc})") from exc
            for name, value in samples.items():
                if wanted(name):
                    metrics[name] = metrics.get(name, 0.0) + value
        return metrics

    async def _cuda_gauges(self, processes: Processes) -> dict[str, float]:
        """The speech processes' CUDA memory gauges; {} when one cannot be read (the level's end says why)."""
        try:
            return await self._speech_metrics(processes, lambda name: name in CUDA_GAUGES.values())
        except Skipped:
            return {}

    async def _snapshot(self, processes: Processes) -> Snapshot:
        metrics = await self._speech_metrics(
            processes,
            lambda name: (
                (name.startswith((*SPEECH_METRICS, GC_PAUSES, LOOP_LAG)) and name.endswith(COUNTERS))
                or name.startswith((f"{GC_PAUSES}_bucket:", f"{LOOP_LAG}_bucket:"))
            ),
        )
        gateway_metrics = await self._gateway_loop_lag()
        at_s = time.perf_counter()
        speech_cpu_s, gateway_cpu_s = _cpu_s(processes.speech_pids), _cpu_s(processes.gateway_pids)
        return Snapshot(at_s, metrics, gateway_metrics, speech_cpu_s, gateway_cpu_s)

    async def _gateway_loop_lag(self) -> dict[str, float]:
        """The event-loop lag histogram on the gateway's /metrics (its workers' merged)."""
        try:
            async with self.http.get("/metrics") as reply:
                reply.raise_for_status()
                samples = parse_metrics(await reply.text(), buckets_of=(LOOP_LAG,))
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise Skipped(f"the gateway's /metrics: {type(exc).__name__}: {exc}") from exc
        return {name: value for name, value in samples.items() if name.startswith(LOOP_LAG)}


def _cpu_s(pids: frozenset[int]) -> float:
    seconds = [cpu_s(pid) for pid in pids]
    if None in seconds:
        raise Skipped("a process exited during the level")
    return sum(seconds)


def local_pids(backend: str, targets: list[str], found: list[Listener]) -> set[int]:
    """The processes of this machine serving a backend's `targets`; raises Skipped if one is elsewhere."""
    if not targets:
        raise Skipped(f"the gateway has no {backend} targets")
    pids = set()
    for target in targets:
        host, port = target.rsplit(":", 1)
        local = pids_on(int(port), found) if is_local(host) else set()
        if not local:
            raise Skipped(f"{backend} {target} is not a process on this machine")
        pids |= local
    return pids


async def metrics_url(
    scraper: aiohttp.ClientSession, pid: int, found: list[Listener], grpc_ports: set[int], prefixes: tuple[str, ...]
) -> str | None:
    """The /metrics of `pid`: the first of its other ports that serves metrics named with one of `prefixes`."""
    for listener in found:
        if listener.pid != pid or listener.port in grpc_ports:
            continue
        host = f"[{listener.host}]" if ":" in listener.host else listener.host
        url = f"http://{host}:{listener.port}/metrics"
        try:
            async with scraper.get(url) as reply:
                text = await reply.text() if reply.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            continue
        if any(prefix in text for prefix in prefixes):
            return url
    return None

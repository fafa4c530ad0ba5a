"""The vocoder engine: many decode streams, their chunk decodes batched into one forward on a runner thread.

The asyncio side only enqueues and consumes: `DecodeStream.send` queues frames, the engine task groups the
pending chunks of all streams by length into batches (after a short window; chunks of streams well ahead of their
listeners wait for a sweep that decodes them together, in batches of the sizes the runner computes without idle
rows, unless they can take the idle rows of a batch decoded before), runs a few of them off the event loop, those
of the streams least ahead of their listeners first, then back to back the last pieces of those of them whose input
has ended, plans again, and hands the audio to each stream's bounded output. A stream's decoder state is freed as
soon as it finishes, is closed (cancelled) or goes idle past the timeout (abandoned).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from chorus.runtime.errors import InvalidRequest, Overloaded, Unavailable
from chorus.runtime.streams import use_own_stream
from chorus.runtime.tasks import exit_if_it_fails
from chorus.vocoder.engine.encoding import EncodedAudio, encode_audio_bytes
from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.engine.stream import PcmPiece, PendingFrames, StreamRecord, StreamStatus
from chorus.vocoder.models.codec_encoder import CodecEncoder

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class EngineSettings:
    max_batch_size: int = 64
    batch_window_s: float = 0.002  # wait this long after new work so concurrent chunks share a forward
    # A stream at least `ahead_lead_s` of audio ahead of its listener is not urgent: its chunks wait for a sweep, due
    # `sweep_interval_s` after the first chunk left waiting, which decodes every waiting stream together. Out of step
    # with each other, streams past their first chunks would otherwise decode a few at a time. 0: no sweeps.
    sweep_interval_s: float = 0.1
    ahead_lead_s: float = 0.5
    # A plan (the batches decoded back to back before the engine looks at its streams again) runs at most this many
    # batches, the earliest deadline first (`DecodeEngine._deadline_s`); the pieces of the others stay queued, with a
    # sweep due at once. So a newcomer's first pieces wait for two batches, not a whole sweep (six of ~30 ms at 256
    # streams); 0: no cap. It also bounds the rounds of ending streams' next pieces that follow a plan
    # (`_plan_endings`).
    max_plan_batches: int = 2
    max_chunk_frames: int = 25  # longer chunks are decoded in pieces (exact: the state carries over)
    # Decode pieces of these frame counts only (include 1); empty: any count. On CUDA the captured graph lengths,
    # so every decode replays a graph: an uncaptured length runs eager and autotunes its convolutions (~1 s). A
    # stream's last frames are decoded as one piece padded up to a length (the decoder is causal: the padding
    # changes none of their audio, and the state it leaves is never used), not as several.
    piece_lengths: tuple[int, ...] = ()
    # The batch sizes the runner computes (on CUDA the captured graph sizes; a batch between two is padded up to the
    # larger with idle rows); empty: any size. A sweep takes as many streams as fill a size, leaving the others,
    # which are ahead of their listeners, to the next sweep; outside one they only fill urgent batches' idle rows.
    batch_sizes: tuple[int, ...] = ()
    max_pending_frames: int = 1000  # per stream; `send` waits beyond this
    max_pending_outputs: int = 8  # per stream; decoding pauses until the reader catches up
    idle_timeout_s: float = 60.0  # no send and no read for this long: the client is gone
    max_reference_audio_s: float = 60.0  # longest audio `encode` accepts


@dataclasses.dataclass(frozen=True, slots=True)
class BatchReport:
    """One batched chunk decode, for metrics (decode time per chunk, batch size, audio seconds per second)."""

    batch_size: int
    num_rows: int  # rows the forward computed: the batch padded up to one of `batch_sizes`
    num_frames: int  # per row, a stream's last piece padded up included
    decode_s: float  # wall time of the runner call
    audio_s: float  # audio produced by the whole batch (context frames included, padding excluded)
    # Of the streams whose input had ended: from that end to this batch's start, for those it decodes for the first
    # time since (what their last pieces waited for), and to its end, for those it leaves with nothing to decode
    # (their callers' wait on the vocoder after the talker's end).
    end_waits_s: tuple[float, ...] = ()
    end_tails_s: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot for load reports and gauges."""

    live_streams: int
    free_slots: int
    queued_streams: int  # live streams with frames waiting to be decoded
    state_bytes: int  # decoder state held by live streams
    num_batches: int
    num_frames_decoded: int
    decode_s: float  # runner time, summed over batches


class _Piece(NamedTuple):
    record: StreamRecord
    piece: PendingFrames  # its codes padded up for a stream's last piece
    num_frames: int  # the stream's frames in it


def batch_rows(batch_size: int, sizes: list[int]) -> int:
    """Rows the runner computes for a batch: the smallest of `sizes` (sorted) that holds it, else the batch itself."""
    return next((size for size in sizes if size >= batch_size), batch_size)


def batch_counts(num_urgent: int, num_ahead: int, settings: EngineSettings, is_sweep: bool = True) -> list[int]:
    """How many pieces of one length each batch takes, the urgent ones first: every urgent piece, and of those
    ahead of their listeners, in a sweep as many as fill batches of `settings.batch_sizes` (when the urgent ones
    alone need a batch padded up, as many as fill its padding), outside a sweep only as many as fill the urgent ones'
    padding (an idle row costs the GPU what a stream's row does); with no `batch_sizes`, every piece in a sweep,
    every urgent one outside. Batches hold at most `max_batch_size`."""
    sizes, largest = sorted(settings.batch_sizes), settings.max_batch_size
    if not is_sweep:
        counts = []
        for count in batch_counts(num_urgent, 0, settings):
            fill = min(num_ahead, batch_rows(count, sizes) - count)
            counts.append(count + fill)
            num_ahead -= fill
        return counts
    counts, total = [], num_urgent + num_ahead
    while total > 0:
        if total >= largest or not sizes:
            count = min(total, largest)
        else:
            whole = max((size for size in sizes if size <= total), default=0)
            holding_urgent = next((size for size in sizes if size >= num_urgent), total)
            count = whole if whole >= num_urgent else min(total, holding_urgent)
            if count == 0:  # nothing urgent, and too few others for the smallest size: they wait
                break
        counts.append(count)
        total -= count
        num_urgent = max(0, num_urgent - count)
        if num_urgent == 0 and count < largest and sizes:
            break  # what is left waits for the next sweep
    return counts


class DecodeEngine:
    def __init__(
        self,
        runner: CodecRunner,
        settings: EngineSettings | None = None,
        encoder: CodecEncoder | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        stream_priority: int | None = None,
    ) -> None:
        """`on_batch` is called on the event loop after every batched decode (metrics hook); `stream_priority`:
        decode on a CUDA stream of this priority (None: the default stream)."""
        settings = settings or EngineSettings()
        self.runner = runner
        self.encoder = encoder
        self.settings = settings
        self.samples_per_frame = runner.decoder.samples_per_frame
        self._config = runner.decoder.config
        self._frame_s = self.samples_per_frame / self._config.output_sample_rate_hz
        self._sweep_at_s: float | None = None  # set while chunks wait for a sweep
        self._piece_lengths, self._batch_sizes = sorted(settings.piece_lengths), sorted(settings.batch_sizes)
        self._free_slots = collections.deque(range(runner.max_streams))
        self._streams: dict[int, StreamRecord] = {}
        self._wakeup = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1,
            thread_name_prefix="vocoder-runner",
            initializer=use_own_stream,
            initargs=(runner.device, stream_priority),
        )
        self._task: asyncio.Task | None = None
        self._is_stopping = False
        self._on_batch = on_batch
        self._num_batches = 0
        self._num_frames_decoded = 0
        self._decode_s = 0.0

    async def start(self) -> None:
        self._task = exit_if_it_fails(asyncio.create_task(self._run(), name="vocoder-engine"), "vocoder engine")

    async def stop(self) -> None:
        for record in list(self._streams.values()):
            self._release(record, StreamStatus.CANCELLED)
        if self._task is not None:
            # A flag, not only cancel(): Python 3.11's wait_for can swallow a cancel that lands as it wakes up.
            self._is_stopping = True
            self._wakeup.set()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=True)
        self.runner.close()

    def run_in_runner_thread(self, fn, *args):
        """Runs `fn(*args)` on the thread that owns the model (e.g. the codec encoder) and awaits it."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def encode(self, data: bytes) -> EncodedAudio:
        """An uploaded audio file → codes (`Vocoder.Encode`), computed on the runner thread.
        Raises AudioInputError (INVALID_ARGUMENT) for empty, too long or undecodable audio."""
        encoder = self.encoder
        if encoder is None:
            raise Unavailable("vocoder: this process has no codec encoder")
        max_duration_s = self.settings.max_reference_audio_s
        return await self.run_in_runner_thread(
            lambda: encode_audio_bytes(
                encoder, data, sample_rate_hz=encoder.sample_rate_hz, max_duration_s=max_duration_s
            )
        )

    def open_stream(self, request_id: str, context_codes: np.ndarray | None = None) -> DecodeStream:
        """A new stream; `context_codes` (frames, num_quantizers) prime its state without producing audio.
        Raises Overloaded when every state slot is taken."""
        if self._task is None or self._task.done() or self._is_stopping:
            raise Unavailable("vocoder engine is not running")
        if context_codes is not None:
            context_codes = self._check_codes(context_codes, "context_codes")
        if not self._free_slots:
            raise Overloaded(f"vocoder: all {self.runner.max_streams} decode streams are busy", retry_after_s=1.0)
        record = StreamRecord(request_id, self._free_slots.popleft(), self.settings.max_pending_outputs)
        self._streams[record.slot] = record
        if context_codes is not None:
            record.push(context_codes, is_context=True)
            self._wakeup.set()
        return DecodeStream(self, record)

    def stats(self) -> EngineStats:
        """Safe from any thread (the /metrics server calls it from its own): it walks a copy of the live streams,
        which `list` takes at once, where iterating the dict could meet the event loop adding or ending one."""
        records = list(self._streams.values())
        return EngineStats(
            live_streams=len(records),
            free_slots=len(self._free_slots),
            queued_streams=sum(1 for record in records if record.segments),
            state_bytes=len(records) * self.runner.bytes_per_stream,
            num_batches=self._num_batches,
            num_frames_decoded=self._num_frames_decoded,
            decode_s=self._decode_s,
        )

    def _check_codes(self, codes: np.ndarray, field: str) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[1] != self._config.num_quantizers:
            raise InvalidRequest(f"{field}: expected (frames, {self._config.num_quantizers}) codes, got {codes.shape}")
        outside = (codes < 0) | (codes >= self._config.codebook_size)
        if outside.any():
            frame, codebook = (int(i) for i in np.argwhere(outside)[0])
            raise InvalidRequest(
                f"{field}: codes must be in [0, {self._config.codebook_size}), "
                f"got {codes[frame, codebook]} at frame {frame}, codebook {codebook}"
            )
        return codes.astype(np.int64, copy=False)

    async def _run(self) -> None:
        reap_interval_s = max(0.05, min(1.0, self.settings.idle_timeout_s / 4))
        while not self._is_stopping:
            timeout_s = reap_interval_s
            if self._sweep_at_s is not None:
                timeout_s = min(timeout_s, max(0.0, self._sweep_at_s - time.monotonic()))
            with contextlib.suppress(TimeoutError):  # on timeout: a sweep is due, or idle streams may be reaped
                await asyncio.wait_for(self._wakeup.wait(), timeout=timeout_s)
            self._wakeup.clear()
            if self._is_stopping:
                break
            if self.settings.batch_window_s > 0 and self._may_join_soon():
                await asyncio.sleep(self.settings.batch_window_s)
            self._reap_idle()
            try:
                await self._decode_plan()
            except Exception as exc:
                # Not a decode's failure (its batch's streams fail with it) but the engine's own: it must not end the
                # task, which left every later stream refused while health still said SERVING. The streams it may
                # have left half-planned fail with the error (their callers fail over); new ones decode.
                records = list(self._streams.values())
                ids = ", ".join(record.request_id for record in records)
                _log.exception("vocoder engine failed; failing its streams: %s", ids)
                for record in records:
                    record.is_in_flight, record.error = False, exc
                    self._release(record, StreamStatus.FAILED)
            now_s = time.monotonic()
            if any(record.can_schedule() and self._is_urgent(record, now_s) for record in self._streams.values()):
                self._wakeup.set()

    async def _decode_plan(self) -> None:
        """One plan's batches (`_plan_batches`), then rounds of ending streams' next pieces (`_plan_endings`)."""
        batches, rounds = self._plan_batches(), 0
        while batches:
            for batch in batches:
                await self._decode_batch(batch)
            rounds += 1
            is_capped = 0 < self.settings.max_plan_batches < rounds
            batches = [] if is_capped else self._plan_endings(batches)

    def _is_urgent(self, record: StreamRecord, now_s: float) -> bool:
        """Whether a stream's pending frames go in the next batch rather than the next sweep: its listener is less
        than `ahead_lead_s` ahead of them, its input has ended (its caller waits for the end), or they are context
        frames (a fail-over's priming, before the audio the listener waits for)."""
        if self.settings.sweep_interval_s <= 0 or record.is_input_done or record.segments[0].is_context:
            return True
        return record.lead_s(now_s, self._frame_s) < self.settings.ahead_lead_s

    def _may_join_soon(self) -> bool:
        """Whether an open stream without frames to decode could send some within the batching window, which is
        what the window waits for. With none (a lone stream, or every stream with work already) it would only
        delay the decode: 2 ms of a lone stream's 26 ms to first audio."""
        return any(
            record.status is StreamStatus.OPEN and not record.is_input_done and not record.segments
            for record in self._streams.values()
        )

    def _plan_batches(self) -> list[list[_Piece]]:
        """Plans one piece of every schedulable stream that is urgent, and of the others too in a sweep or where they
        fill an urgent batch's idle rows, groups pieces of equal length into batches (`batch_counts`) and takes those
        of the first `max_plan_batches`, the batches holding the earliest deadline first (`_deadline_s`): the streams
        a sweep leaves, and the first stream left waiting outside a sweep, set the next sweep; batches beyond the cap
        leave one due at once."""
        now_s = time.monotonic()
        is_sweep = self._sweep_at_s is not None and now_s >= self._sweep_at_s
        if is_sweep:
            self._sweep_at_s = None
        # (stream, frames taken, frames decoded) by the frames decoded
        urgent: dict[int, list[tuple[StreamRecord, int, int]]] = collections.defaultdict(list)
        ahead: dict[int, list[tuple[StreamRecord, int, int]]] = collections.defaultdict(list)
        for record in self._streams.values():
            if not record.can_schedule():
                continue
            is_urgent = self._is_urgent(record, now_s)
            num_frames, decoded = self._next_piece(record)
            (urgent if is_urgent else ahead)[decoded].append((record, num_frames, decoded))
        planned = []
        for length in sorted(urgent.keys() | ahead.keys()):  # the shortest first: newcomers' first chunks
            # The least ahead first: those left wait for the next sweep.
            candidates = urgent[length] + sorted(ahead[length], key=lambda plan: plan[0].lead_s(now_s, self._frame_s))
            batches = self._batches_of(candidates, len(urgent[length]), is_sweep)
            planned += batches
            if sum(map(len, batches)) < len(candidates):
                self._sweep_later(now_s)
        cap = self.settings.max_plan_batches if self.settings.max_plan_batches > 0 else len(planned)
        if len(planned) > cap:
            # Earliest deadline first (the sort is stable: of equal ones, e.g. newcomers', the shortest pieces).
            planned.sort(key=lambda plans: min(self._deadline_s(record, now_s) for record, _, _ in plans))
            self._sweep_at_s = now_s
        return self._take_batches(planned[:cap])

    def _deadline_s(self, record: StreamRecord, now_s: float) -> float:
        """When a stream's next piece is wanted, in seconds from now: when its listener reaches it (its lead); for a
        stream whose input has ended, no later than `ahead_lead_s`, as its caller waits for the end (a closed-loop
        client's next request, a whole file). By lead alone, seconds ahead, last pieces went after every other batch
        of a capped plan while closed-loop clients' talker slots sat empty; at once, they crowded newcomers' next
        pieces out at 256 streams (underruns)."""
        lead_s = record.lead_s(now_s, self._frame_s)
        return min(lead_s, self.settings.ahead_lead_s) if record.is_input_done else lead_s

    def _plan_endings(self, decoded: list[list[_Piece]]) -> list[list[_Piece]]:
        """The next pieces of the streams in `decoded` whose input has ended, in batches of their own by length: a
        stream's last pieces decode back to back, not one a plan (its caller waits for its end: a closed-loop
        client's next request, a whole file). Its talker's last chunks often leave it two pieces queued. At most
        `max_plan_batches` such rounds follow a plan: a stream with many pieces queued at its end (a fail-over's
        replay) does not hold a newcomer's first piece back for all of them."""
        endings: dict[int, list[tuple[StreamRecord, int, int]]] = collections.defaultdict(list)
        for record in (entry.record for batch in decoded for entry in batch):
            if record.is_input_done and record.can_schedule():
                num_frames, num_decoded = self._next_piece(record)
                endings[num_decoded].append((record, num_frames, num_decoded))
        batches = [
            batch
            for length in sorted(endings)
            for batch in self._batches_of(endings[length], len(endings[length]), is_sweep=False)
        ]
        return self._take_batches(batches)

    def _batches_of(self, candidates: list, num_urgent: int, is_sweep: bool) -> list[list]:
        """`candidates` (pieces of one length, the first `num_urgent` urgent) cut into the batches `batch_counts`
        takes."""
        batches, taken = [], 0
        for count in batch_counts(num_urgent, len(candidates) - num_urgent, self.settings, is_sweep):
            batches.append(candidates[taken : taken + count])
            taken += count
        return batches

    def _take_batches(self, batches: list[list[tuple[StreamRecord, int, int]]]) -> list[list[_Piece]]:
        """Each planned (stream, frames taken, frames decoded) taken from its stream (`_take`), batch by batch."""
        return [[self._take(*plan) for plan in plans] for plans in batches]

    def _sweep_later(self, now_s: float) -> None:
        if self._sweep_at_s is None:
            self._sweep_at_s = now_s + self.settings.sweep_interval_s

    def _next_piece(self, record: StreamRecord) -> tuple[int, int]:
        """(frames taken, frames decoded) of a stream's next piece: the longest of `piece_lengths` that fits, or all
        of its next segment up to `max_chunk_frames` when any length goes; a stream's last frames, when they fit one
        length, in one piece padded up to it."""
        head = record.segments[0]
        available = len(head.codes)
        limit = min(available, self.settings.max_chunk_frames)
        fitting = [frames for frames in self._piece_lengths if frames <= limit]
        taken = fitting[-1] if fitting else limit
        is_last = record.is_input_done and len(record.segments) == 1 and not head.is_context
        padded = next((frames for frames in self._piece_lengths if frames >= available), None)
        if is_last and taken < available and padded is not None and available <= self.settings.max_chunk_frames:
            return available, padded
        return taken, taken

    def _take(self, record: StreamRecord, num_frames: int, decoded: int) -> _Piece:
        """A stream's next piece (`_next_piece`'s plan), its codes padded up to `decoded` frames."""
        piece = record.take(num_frames)
        record.is_in_flight = True
        if decoded > num_frames:  # a last piece: the padding codes are never heard
            padding = np.zeros((decoded - num_frames, piece.codes.shape[1]), dtype=piece.codes.dtype)
            piece = PendingFrames(np.concatenate((piece.codes, padding)), piece.is_context)
        return _Piece(record, piece, num_frames)

    async def _decode_batch(self, batch: list[_Piece]) -> None:
        slots = [entry.record.slot for entry in batch]
        new_slots = [entry.record.slot for entry in batch if not entry.record.is_started]
        codes = torch.from_numpy(np.stack([entry.piece.codes for entry in batch]))
        ended = [entry.record for entry in batch if entry.record.is_input_done]
        first_since_end = [record for record in ended if not record.is_decoded_since_end]
        for record in first_since_end:
            record.is_decoded_since_end = True
        end_waits_s = tuple(time.monotonic() - record.input_done_s for record in first_since_end)
        started = time.perf_counter()
        try:
            waveform = await self.run_in_runner_thread(self.runner.decode, slots, codes, new_slots)
        except Exception as exc:
            for entry in batch:
                entry.record.is_in_flight = False
                entry.record.error = exc
                self._release(entry.record, StreamStatus.FAILED)
            return
        elapsed_s = time.perf_counter() - started
        num_frames = sum(entry.num_frames for entry in batch)
        self._num_batches += 1
        self._num_frames_decoded += num_frames
        self._decode_s += elapsed_s
        if self._on_batch is not None:
            now_s, rows = time.monotonic(), batch_rows(len(batch), self._batch_sizes)
            # The streams this batch leaves with nothing to decode (and not closed meanwhile): their last audio is out.
            done = [record for record in ended if record.status is StreamStatus.OPEN and not record.segments]
            end_tails_s = tuple(now_s - record.input_done_s for record in done)
            audio_s = num_frames * self._frame_s
            self._on_batch(BatchReport(len(batch), rows, codes.shape[1], elapsed_s, audio_s, end_waits_s, end_tails_s))
        samples = waveform.numpy()
        for row, (record, piece, num_frames) in enumerate(batch):
            record.is_in_flight = False
            record.is_started = True
            if record.status is not StreamStatus.OPEN:
                self._release(record, record.status)  # closed while in flight: its slot waited for this batch
                continue
            if not piece.is_context:
                offset = record.num_frames_decoded * self.samples_per_frame
                record.first_output_s = record.first_output_s or time.monotonic()
                audio = samples[row, : num_frames * self.samples_per_frame]
                record.outputs.append(PcmPiece(audio, offset, num_frames))
                record.num_frames_decoded += num_frames
                record.output_ready.set()
            if record.num_pending_frames < self.settings.max_pending_frames:
                record.input_room.set()
            if record.is_drained:
                self._release(record, StreamStatus.FINISHED)

    def _reap_idle(self) -> None:
        deadline = time.monotonic() - self.settings.idle_timeout_s
        for record in list(self._streams.values()):
            if record.last_activity_s < deadline:
                self._release(record, StreamStatus.ABANDONED)

    def _release(self, record: StreamRecord, status: StreamStatus) -> None:
        """Ends the stream (first status wins) and frees its slot once no batch holds it."""
        if record.status is StreamStatus.OPEN:
            record.status = status
            if status is not StreamStatus.FINISHED:
                record.outputs.clear()
                record.segments.clear()
            record.output_ready.set()
            record.input_room.set()
        if not record.is_in_flight and self._streams.get(record.slot) is record:
            del self._streams[record.slot]
            self._free_slots.append(record.slot)


class StreamEnded(Unavailable):
    """The stream ended before the caller was done with it (abandoned, failed or closed)."""


class DecodeStream:
    """The owner's handle: `send` frames, `end_input`, iterate the `PcmPiece`s, `close` (also on exit of
    `async with`). Only new frames are sent; the engine keeps the context."""

    def __init__(self, engine: DecodeEngine, record: StreamRecord) -> None:
        self._engine = engine
        self._record = record

    @property
    def request_id(self) -> str:
        return self._record.request_id

    @property
    def status(self) -> StreamStatus:
        return self._record.status

    @property
    def num_frames_decoded(self) -> int:
        """Frames whose audio was produced (context frames excluded), for the Final usage."""
        return self._record.num_frames_decoded

    async def send(self, codes: np.ndarray) -> None:
        """Queues (frames, num_quantizers) codes; waits while too many frames are pending."""
        record = self._record
        checked = self._engine._check_codes(codes, "codes")
        if record.is_input_done:
            raise InvalidRequest("codes: sent after end_of_input")
        while (
            record.status is StreamStatus.OPEN and record.num_pending_frames >= self._engine.settings.max_pending_frames
        ):
            record.input_room.clear()
            await record.input_room.wait()
        self._raise_if_ended()
        record.touch()
        record.push(checked, is_context=False)
        self._engine._wakeup.set()

    def end_input(self) -> None:
        record = self._record
        record.is_input_done, record.input_done_s = True, time.monotonic()
        record.touch()
        if record.is_drained:
            self._engine._release(record, StreamStatus.FINISHED)
        self._engine._wakeup.set()

    def close(self) -> None:
        """Cancels the stream if it is still running and frees its state; idempotent."""
        self._engine._release(self._record, StreamStatus.CANCELLED)

    def __aiter__(self) -> DecodeStream:
        return self

    async def __anext__(self) -> PcmPiece:
        record = self._record
        while True:
            if record.outputs:
                record.touch()
                self._engine._wakeup.set()  # room for more output
                return record.outputs.popleft()
            if record.status is StreamStatus.FINISHED:
                raise StopAsyncIteration
            self._raise_if_ended()
            record.output_ready.clear()
            await record.output_ready.wait()

    def _raise_if_ended(self) -> None:
        record = self._record
        if record.status is StreamStatus.OPEN:
            return
        if record.status is StreamStatus.FAILED:
            raise StreamEnded(f"decode stream {record.request_id} failed") from record.error
        raise StreamEnded(f"decode stream {record.request_id} is {record.status.value}")

    async def __aenter__(self) -> DecodeStream:
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.close()

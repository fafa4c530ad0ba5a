"""Running one speech request: segments → talker/vocoder pipelines → encoder → output journal.

The run is a task of its own, detached from any one client connection: readers (the first
response, resumes on any replica) follow the journal. When the last reader on this replica
leaves, the run is cancelled after `detach_grace_s` unless a reader comes back, which frees the
backends' slots promptly while allowing a quick reconnect to resume live. A cancel requested on
any replica (the record's flag, woken early by pub/sub) stops the run as well.

The record ends `done`, `failed` or `cancelled`, and the journal gets its end marker either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.metrics import REAL_TIME_FACTOR, TIME_TO_FIRST_AUDIO_S
from chorus.gateway.ordered import ordered_concurrent
from chorus.gateway.segmenter import split_segments
from chorus.gateway.speech_pipeline import pcm_samples
from chorus.gateway.state.cancel import wait_for_cancel
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import CANCELLED, DONE, FAILED, RUNNING, RequestStore
from chorus.runtime.errors import ChorusError, status_for
from chorus.v1 import common_pb2, talker_pb2

log = logging.getLogger("chorus.gateway.speech")
_DEFAULT_RATE_HZ = 24_000  # Qwen3-TTS output rate, for the header of an empty result

# (segment request) → PCM chunks; in production `synthesize_segment` bound to picked replicas.
SegmentSource = Callable[[talker_pb2.SynthesisRequest], AsyncIterator[common_pb2.PcmChunk]]


def segment_requests(
    request_id: str, base: talker_pb2.SynthesisRequest, text: str, max_segment_chars: int
) -> list[talker_pb2.SynthesisRequest]:
    """One SynthesisRequest per sentence-bounded segment of `text`, ids `<request_id>.<index>`."""
    requests = []
    for index, segment in enumerate(split_segments(text, max_segment_chars)):
        request = talker_pb2.SynthesisRequest()
        request.CopyFrom(base)
        request.request_id = f"{request_id}.{index}"
        request.text = segment
        requests.append(request)
    return requests


class SpeechRun:
    def __init__(
        self,
        requests: RequestStore,
        journal: OutputJournal,
        request_id: str,
        segments: list[talker_pb2.SynthesisRequest],
        source: SegmentSource,
        response_format: str,
        speed: float = 1.0,
        max_concurrent_segments: int = 2,
    ) -> None:
        self.requests = requests
        self.journal = journal
        self.request_id = request_id
        self.segments = segments
        self.source = source
        self.response_format = response_format
        self.speed = speed
        self.max_concurrent_segments = max_concurrent_segments
        self.time_to_first_audio_s: float | None = None

    async def run(self) -> str:
        """Runs to the end; returns the final status. Never raises for a failed request."""
        if not await self.requests.transition(self.request_id, RUNNING):
            return (await self.requests.get(self.request_id)).status  # cancelled before it started
        cancel_watch = asyncio.create_task(wait_for_cancel(self.requests, self.request_id))
        produce = asyncio.create_task(self._produce())
        try:
            await asyncio.wait({cancel_watch, produce}, return_when=asyncio.FIRST_COMPLETED)
            if cancel_watch.done() and cancel_watch.exception() is not None:
                # Redis failed while watching: the run's own journal writes will surface it.
                await asyncio.wait({produce})
            if not produce.done():  # a cancel was requested
                produce.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await produce
                return await self._end(CANCELLED, None, None)
            try:
                usage = produce.result()
            except ChorusError as exc:
                code, message = status_for(exc)
                return await self._end(FAILED, {"code": code.name, "message": message}, None)
            except Exception:
                log.exception("speech request %s failed", self.request_id)
                return await self._end(FAILED, {"code": "INTERNAL", "message": "internal error"}, None)
            return await self._end(DONE, None, usage)
        except asyncio.CancelledError:  # detached: no reader came back in time
            produce.cancel()
            await self._end(CANCELLED, {"code": "CANCELLED", "message": "the client went away"}, None)
            raise
        finally:
            cancel_watch.cancel()
            produce.cancel()

    async def _produce(self) -> dict:
        started = time.monotonic()
        encoder: StreamingEncoder | None = None
        is_flushed = False
        sequence, num_samples, sample_rate_hz = 0, 0, 0
        chunks = ordered_concurrent(self.segments, self.source, self.max_concurrent_segments)
        try:
            async for pcm in chunks:
                samples = pcm_samples(pcm)
                if encoder is None:
                    sample_rate_hz = pcm.sample_rate_hz
                    encoder = StreamingEncoder(self.response_format, sample_rate_hz, samples.shape[1], self.speed)
                num_samples += samples.shape[0]
                sequence = await self._journal(sequence, encoder.encode(samples))
                if self.time_to_first_audio_s is None and sequence > 0:
                    self.time_to_first_audio_s = time.monotonic() - started
                    TIME_TO_FIRST_AUDIO_S.labels("speech").observe(self.time_to_first_audio_s)
            if encoder is None:  # no audio at all (e.g. immediate EOS): still a valid, empty file
                encoder = StreamingEncoder(self.response_format, _DEFAULT_RATE_HZ)
            is_flushed = True
            sequence = await self._journal(sequence, encoder.flush())
        finally:
            await chunks.aclose()
            if encoder is not None and not is_flushed:
                encoder.close()
        audio_s = num_samples / sample_rate_hz if sample_rate_hz else 0.0
        if audio_s > 0:
            REAL_TIME_FACTOR.labels("speech").observe((time.monotonic() - started) / audio_s)
        return {"audio_s": audio_s, "num_segments": len(self.segments), "last_sequence": sequence - 1}

    async def _journal(self, sequence: int, data: bytes) -> int:
        if not data:
            return sequence
        await self.journal.append(self.request_id, sequence, data)
        return sequence + 1

    async def _end(self, status: str, error: dict | None, usage: dict | None) -> str:
        fields = {"error": error} if error else {}
        if usage:
            fields |= {"usage": usage, "last_sequence": usage["last_sequence"]}
        with contextlib.suppress(ChorusError):  # Redis down: the record's TTL and readers' checks cover it
            await self.requests.transition(self.request_id, status, **fields)
            await self.journal.finish(self.request_id, status, error=error, usage=usage)
        return status


class SpeechRunner:
    """The runs of this gateway replica, each cancelled once it has had no reader for `detach_grace_s`."""

    def __init__(self, detach_grace_s: float = 0.75) -> None:
        self.detach_grace_s = detach_grace_s
        self._tasks: dict[str, asyncio.Task] = {}
        self._num_readers: dict[str, int] = {}
        self._detach_timers: dict[str, asyncio.TimerHandle] = {}

    def start(self, run: SpeechRun) -> asyncio.Task:
        task = asyncio.create_task(run.run(), name=f"speech-{run.request_id}")
        self._tasks[run.request_id] = task
        self._num_readers[run.request_id] = 0
        task.add_done_callback(lambda _: self._forget(run.request_id))
        return task

    @contextlib.contextmanager
    def reading(self, request_id: str):
        """Marks a reader of `request_id` for the duration of the block."""
        if request_id not in self._tasks:
            yield  # the run lives on another replica (or is over): nothing to keep alive here
            return
        timer = self._detach_timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()
        self._num_readers[request_id] += 1
        try:
            yield
        finally:
            if request_id in self._num_readers:
                self._num_readers[request_id] -= 1
                if self._num_readers[request_id] == 0:
                    loop = asyncio.get_running_loop()
                    self._detach_timers[request_id] = loop.call_later(self.detach_grace_s, self._detach, request_id)

    def _detach(self, request_id: str) -> None:
        self._detach_timers.pop(request_id, None)
        task = self._tasks.get(request_id)
        if task is not None and self._num_readers.get(request_id) == 0:
            task.cancel()

    def _forget(self, request_id: str) -> None:
        self._tasks.pop(request_id, None)
        self._num_readers.pop(request_id, None)
        timer = self._detach_timers.pop(request_id, None)
        if timer is not None:
            timer.cancel()

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

"""Running one speech request: segments → talker/vocoder pipelines → encoder → output journal.

The run's lifecycle (record, cancel, end marker) is `JournaledRun`'s; `RunRegistry` keeps it
alive while readers follow its output, and tells its `OutputLead` how far they got: the run
pauses while it is `max_lead_s` of audio ahead of them. Each segment's codec frames are kept in a
`FrameLog` (what a backend fail-over continues from) and journaled in Redis (what another gateway
process continues from when it takes the run over: `frames`, one per segment). The run marks on its
record when its first audio's frames came from the talker (first_frame), its PCM from the vocoder (first_pcm)
and its first bytes were journaled for readers (first_audio); and for its next few pieces, when each one's frames
and PCM came and when it was journaled (frames_1, pcm_1, journaled_1, …); at its end, when the talker's last frames
came (last_frame), then its Final (talker_done), and the vocoder's last PCM (last_pcm); and, from the first segment's
talker Final, when the talker took the call in (talker_received) and admitted it (talker_admitted), on its clock,
after this process had opened the call (talker_called).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor

from chorus.gateway import proto_convert
from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.audio.encoder_threads import stream_order
from chorus.gateway.frame_log import FrameLog
from chorus.gateway.journaled_run import JournaledRun
from chorus.gateway.metrics import REAL_TIME_FACTOR, TIME_TO_FIRST_AUDIO_S
from chorus.gateway.ordered import ordered_concurrent
from chorus.gateway.output_lead import OutputLead
from chorus.gateway.segmenter import split_segments
from chorus.gateway.speech_pipeline import CODEC_FRAME_RATE_HZ
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.frames import FrameJournal, SegmentFrames
from chorus.gateway.state.journal import JournalPosition, OutputJournal
from chorus.gateway.state.requests import RequestStore
from chorus.runtime.tasks import raise_if_cancel_lost
from chorus.v1 import common_pb2, talker_pb2
from chorus.wire import chunk_to_pcm

_DEFAULT_RATE_HZ = 24_000  # Qwen3-TTS output rate, for the header of an empty result
MARKED_PIECES = 4  # a run's first pieces of audio, whose timings go on its timeline (`SpeechRun._mark_piece_came`)

# (segment request, its frames) → PCM chunks; in production `synthesize_segment` bound to the backend pool.
SegmentSource = Callable[[talker_pb2.SynthesisRequest, FrameLog], AsyncIterator[common_pb2.PcmChunk]]


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


class _SegmentSink:
    """A segment's frames into the run's frame journal."""

    def __init__(self, journal: FrameJournal, request_id: str, segment: int) -> None:
        self.journal = journal
        self.request_id = request_id
        self.segment = segment

    async def frames(self, offset: int, codes: bytes) -> None:
        await self.journal.append(self.request_id, self.segment, offset, codes)
        # The talker side awaits this for every chunk: a cancel that the Redis command lost would leave it reading
        # its talker stream, holding a talker slot, until the re-cancel a second later.
        raise_if_cancel_lost()

    async def finished(self, num_frames: int) -> None:
        await self.journal.finish(self.request_id, self.segment, num_frames)


class SpeechRun(JournaledRun):
    def __init__(
        self,
        requests: RequestStore,
        journal: OutputJournal,
        cancels: CancelListener,
        request_id: str,
        segments: list[talker_pb2.SynthesisRequest],
        source: SegmentSource,
        response_format: str,
        speed: float = 1.0,
        max_concurrent_segments: int = 2,
        max_lead_s: float | None = 30.0,
        frame_journal: FrameJournal | None = None,
        runner: str = "",
        resume: JournalPosition | None = None,
        frames: list[SegmentFrames] | None = None,
        encoder_threads: Executor | None = None,
    ) -> None:
        """`max_lead_s` None: no bound (a run taken over has no reader here to wait for); `frames`: what the
        frame journal holds of each segment, for a run taken over; `encoder_threads`: where mp3/opus/aac/flac
        chunks are encoded (None: the event loop's default executor)."""
        super().__init__(requests, journal, cancels, request_id, runner, resume)
        self.segments = segments
        self.source = source
        self.response_format = response_format
        self.speed = speed
        self.encoder_threads = encoder_threads
        self.max_concurrent_segments = max_concurrent_segments
        self.time_to_first_audio_s: float | None = None
        self.lead = OutputLead(max_lead_s) if max_lead_s is not None else None
        frames = frames or [SegmentFrames() for _ in segments]
        self.frame_logs = [
            FrameLog(
                kept.codes,
                kept.is_finished,
                frame_journal and _SegmentSink(frame_journal, request_id, index),
                is_taken_over=resume is not None,
            )
            for index, kept in enumerate(frames)
        ]

    def _mark_piece_came(self, piece: int, num_frames: float) -> None:
        """At one of a run's first MARKED_PIECES pieces of PCM: marks when the talker's frames it decodes came (the
        last of them) and when its PCM came — the first piece's `first_frame` and `first_pcm`, the others'
        `frames_<piece>` and `pcm_<piece>` (`chorus bench tts` splits TTFP, and the waits of players that ran dry,
        by them). `num_frames`: the frames decoded so far, this piece's included."""
        if piece >= MARKED_PIECES:
            return
        frames, pcm = ("first_frame", "first_pcm") if piece == 0 else (f"frames_{piece}", f"pcm_{piece}")
        log, last_frame = self.frame_logs[0], round(num_frames) - 1
        if not log.is_taken_over and last_frame < len(log.frame_times):
            self.mark(frames, log.frame_times[last_frame])
        self.mark(pcm)

    def _mark_end_came(self) -> None:
        """At the end of the PCM: marks when the last segment's last frames came (`last_frame`), then the talker's
        Final (`talker_done`), and the vocoder's last PCM (`last_pcm`): `chorus bench tts` splits a request's
        latency at them."""
        log = self.frame_logs[-1]
        if not log.is_taken_over and log.last_frames_at is not None and log.finished_at is not None:
            self.mark("last_frame", log.last_frames_at)
            self.mark("talker_done", log.finished_at)
        self.mark("last_pcm")
        if (timings := self._first_talker_timings()) is not None:
            stamps = (
                ("talker_called", self.frame_logs[0].talker_called_at),
                ("talker_received", timings.received_at_s),
                ("talker_admitted", timings.admitted_at_s),
            )
            for stage, at_s in stamps:
                if at_s:  # 0 or None: not stamped (a talker that does not say)
                    self.mark(stage, at_s)

    def _first_talker_timings(self) -> common_pb2.Timings | None:
        """The talker's own timings of the first segment (TTFP's), unless this process took the run over."""
        first = self.frame_logs[0]
        return None if first.is_taken_over else first.talker_timings

    def _encode_order(self, started_s: float, audio_s: float) -> tuple:
        """This run's place among its process's waiting encodes (`stream_order`), `audio_s` of audio encoded."""
        first_audio_s = None if self.time_to_first_audio_s is None else started_s + self.time_to_first_audio_s
        return stream_order(started_s, first_audio_s, audio_s, time.monotonic())

    async def _produce(self) -> dict:
        started = time.monotonic()
        encoder: StreamingEncoder | None = None
        is_flushed = False
        sequence, num_samples, sample_rate_hz, piece = 0, 0, 0, 0
        chunks = ordered_concurrent(
            range(len(self.segments)),
            lambda index: self.source(self.segments[index], self.frame_logs[index]),
            self.max_concurrent_segments,
        )
        try:
            while True:
                if self.lead is not None:
                    await self.lead.wait_for_room()  # a slow reader: stop pulling from the backends
                pcm = await anext(chunks, None)
                if pcm is None:
                    break
                samples = chunk_to_pcm(pcm)
                if encoder is None:
                    sample_rate_hz = pcm.sample_rate_hz
                    encoder = StreamingEncoder(
                        self.response_format, sample_rate_hz, samples.shape[1], self.speed, self.encoder_threads
                    )
                order = self._encode_order(started, num_samples / sample_rate_hz)
                num_samples += samples.shape[0]
                self._mark_piece_came(piece, num_samples * CODEC_FRAME_RATE_HZ / sample_rate_hz)
                data = await encoder.encode_async(samples, order)
                next_sequence = await self._journal(sequence, data)
                if self.lead is not None and next_sequence > sequence:
                    self.lead.journaled(sequence, num_samples / sample_rate_hz)
                sequence = next_sequence
                if 0 < piece < MARKED_PIECES:
                    self.mark(f"journaled_{piece}")
                piece += 1
                if self.time_to_first_audio_s is None and sequence > 0:
                    self.mark("first_audio")
                    self.time_to_first_audio_s = time.monotonic() - started
                    TIME_TO_FIRST_AUDIO_S.labels("speech").observe(self.time_to_first_audio_s)
            self._mark_end_came()
            if encoder is None:  # no audio at all (e.g. immediate EOS): still a valid, empty file
                encoder = StreamingEncoder(self.response_format, _DEFAULT_RATE_HZ)
            is_flushed = True
            audio_s = num_samples / sample_rate_hz if sample_rate_hz else 0.0
            sequence = await self._journal(sequence, await encoder.flush_async(self._encode_order(started, audio_s)))
        finally:
            await chunks.aclose()
            if encoder is not None and not is_flushed:
                encoder.close()
        if audio_s > 0:
            REAL_TIME_FACTOR.labels("speech").observe((time.monotonic() - started) / audio_s)
        usage = {"audio_s": audio_s, "num_segments": len(self.segments), "last_sequence": sequence - 1}
        if (timings := self._first_talker_timings()) is not None:
            usage["timings"] = proto_convert.timings(timings)
        return usage

"""Running one speech request: segments → talker/vocoder pipelines → encoder → output journal.

The run's lifecycle (record, cancel, end marker) is `JournaledRun`'s; `RunRegistry` keeps it
alive while readers follow its output, and tells its `OutputLead` how far they got: the run
pauses while it is `max_lead_s` of audio ahead of them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.journaled_run import JournaledRun
from chorus.gateway.metrics import REAL_TIME_FACTOR, TIME_TO_FIRST_AUDIO_S
from chorus.gateway.ordered import ordered_concurrent
from chorus.gateway.output_lead import OutputLead
from chorus.gateway.segmenter import split_segments
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import RequestStore
from chorus.v1 import common_pb2, talker_pb2
from chorus.wire import chunk_to_pcm

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
        max_lead_s: float = 30.0,
    ) -> None:
        super().__init__(requests, journal, cancels, request_id)
        self.segments = segments
        self.source = source
        self.response_format = response_format
        self.speed = speed
        self.max_concurrent_segments = max_concurrent_segments
        self.time_to_first_audio_s: float | None = None
        self.lead = OutputLead(max_lead_s)

    async def _produce(self) -> dict:
        started = time.monotonic()
        encoder: StreamingEncoder | None = None
        is_flushed = False
        sequence, num_samples, sample_rate_hz = 0, 0, 0
        chunks = ordered_concurrent(self.segments, self.source, self.max_concurrent_segments)
        try:
            while True:
                await self.lead.wait_for_room()  # a slow reader: stop pulling from the backends
                pcm = await anext(chunks, None)
                if pcm is None:
                    break
                samples = chunk_to_pcm(pcm)
                if encoder is None:
                    sample_rate_hz = pcm.sample_rate_hz
                    encoder = StreamingEncoder(self.response_format, sample_rate_hz, samples.shape[1], self.speed)
                num_samples += samples.shape[0]
                data = encoder.encode(samples)
                if data:
                    self.lead.journaled(sequence, num_samples / sample_rate_hz)
                sequence = await self._journal(sequence, data)
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

"""Running one text-to-audio request: batching window → diffusion replica → encoder → output journal.

The request waits in the gateway's batching window so that requests arriving close together
reach the diffusion service at once (its scheduler then steps them as one batch), then goes to
the least-loaded healthy diffusion replica. Each progress event is recorded on the request's
record (status and SSE readers follow it); the audio is encoded and journaled like speech, so
download and resume work the same way. Cancelling the run cancels the diffusion stream, which
stops the service's sampling loop for this request.
"""

from __future__ import annotations

import time

import grpc

from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.backends import BackendPool
from chorus.gateway.batch_window import BatchWindow
from chorus.gateway.journaled_run import JournaledRun
from chorus.gateway.metrics import REAL_TIME_FACTOR, TIME_TO_FIRST_AUDIO_S
from chorus.gateway.speech_pipeline import check_final, upstream_error
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.journal import OutputJournal
from chorus.gateway.state.requests import RequestStore
from chorus.runtime.errors import Unavailable
from chorus.v1 import common_pb2, diffusion_pb2
from chorus.wire import chunk_to_pcm


class GenerationRun(JournaledRun):
    def __init__(
        self,
        requests: RequestStore,
        journal: OutputJournal,
        cancels: CancelListener,
        request: diffusion_pb2.GenerateRequest,
        backends: BackendPool,
        batch_window: BatchWindow,
        response_format: str,
    ) -> None:
        super().__init__(requests, journal, cancels, request.request_id)
        self.request = request
        self.backends = backends
        self.batch_window = batch_window
        self.response_format = response_format

    async def _produce(self) -> dict:
        started = time.monotonic()
        await self.batch_window.join()
        replica = self.backends.pick("diffusion")
        replica.num_active += 1
        call = replica.stub.Generate(self.request)
        encoder: StreamingEncoder | None = None
        final: common_pb2.Final | None = None
        sequence, num_samples, sample_rate_hz = 0, 0, 0
        try:
            async for output in call:
                kind = output.WhichOneof("output")
                if kind == "progress":
                    await self.requests.set_progress(self.request_id, output.progress.step, output.progress.num_steps)
                elif kind == "audio":
                    samples = chunk_to_pcm(output.audio.pcm)
                    if encoder is None:
                        sample_rate_hz = output.audio.pcm.sample_rate_hz
                        encoder = StreamingEncoder(self.response_format, sample_rate_hz, samples.shape[1])
                        TIME_TO_FIRST_AUDIO_S.labels("audio").observe(time.monotonic() - started)
                    num_samples += samples.shape[0]
                    sequence = await self._journal(sequence, encoder.encode(samples))
                else:
                    final = output.final
            if final is None:
                raise Unavailable("diffusion ended the stream without a Final")
            check_final(final, "diffusion")
            if encoder is None:
                raise Unavailable("diffusion finished without audio")
            sequence = await self._journal(sequence, encoder.flush())
            encoder = None
        except grpc.aio.AioRpcError as exc:
            raise upstream_error(exc, "diffusion") from None
        finally:
            call.cancel()  # no-op when the stream ended; stops the diffusion run otherwise
            replica.num_active -= 1
            if encoder is not None:
                encoder.close()
        audio_s = num_samples / sample_rate_hz
        REAL_TIME_FACTOR.labels("audio").observe((time.monotonic() - started) / audio_s)
        return {"audio_s": audio_s, "num_steps": final.usage.num_steps, "last_sequence": sequence - 1}

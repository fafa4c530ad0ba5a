"""Running one text-to-audio request: diffusion replica → encoder → output journal.

The request goes straight to the least-loaded healthy diffusion replica. There is no batching
window here: the service batches continuously (a request joins the running batch at its next
step, on its own schedule), so holding requests back to send them together would only delay
them. Each progress event is recorded on the request's record (status and SSE readers follow
it). A replica that fails before the audio is complete (dies, hangs, drains) is replaced: the
request starts again from step 0 on another replica with the same seed, so the audio is the
same, and its progress says `restarts`. The audio is kept until the replica's Final, then
encoded and journaled like speech, so download and resume work the same way. Encoding runs in a
worker thread (PyAV and numpy release the GIL): 10 s of stereo mp3 takes ~150 ms, which on the
event loop would stall every other request of this gateway process. Cancelling the run cancels
the diffusion stream, which stops the service's sampling loop for this request.

The run marks its stages on the request's timeline (`JournaledRun.mark`): dispatched (a replica
acquired, its stream opened; again after a fail-over), first_step (the first progress event),
engine_done (the Final), encoded, journaled. The service's own timings from its Final (queue_ms,
first_output_ms, total_ms) go into the usage as `timings`.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor

import grpc
import numpy as np

from chorus.gateway import proto_convert
from chorus.gateway.audio import StreamingEncoder
from chorus.gateway.backends import BackendPool
from chorus.gateway.failover import (
    DEFAULT_POLICY,
    FailoverPolicy,
    Failovers,
    ReplicaFailed,
    await_status,
    check_final_for_failover,
    failure_of,
    next_message,
)
from chorus.gateway.journaled_run import JournaledRun
from chorus.gateway.metrics import REAL_TIME_FACTOR, TIME_TO_FIRST_AUDIO_S
from chorus.gateway.speech_pipeline import check_final, upstream_error
from chorus.gateway.state.cancel import CancelListener
from chorus.gateway.state.journal import JournalPosition, OutputJournal
from chorus.gateway.state.requests import RequestStore
from chorus.runtime.errors import Unavailable
from chorus.runtime.logs import REQUEST_ID_HEADER
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
        response_format: str,
        policy: FailoverPolicy = DEFAULT_POLICY,
        runner: str = "",
        resume: JournalPosition | None = None,
        encoder_threads: Executor | None = None,
    ) -> None:
        """`encoder_threads`: where the file is encoded (None: the event loop's default executor)."""
        super().__init__(requests, journal, cancels, request.request_id, runner, resume)
        self.request = request
        self.backends = backends
        self.response_format = response_format
        self.policy = policy
        self.encoder_threads = encoder_threads

    async def _produce(self) -> dict:
        started = time.monotonic()
        failovers = Failovers("diffusion", self.request_id, self.backends, self.policy)
        while True:
            replica = await self.backends.acquire("diffusion", self.policy.replica_wait_s)
            try:
                final, pcm = await self._generate(replica, failovers.count)
                break
            except ReplicaFailed as error:
                failovers.record(replica, error)
            finally:
                self.backends.release(replica)
        self.mark("engine_done")
        TIME_TO_FIRST_AUDIO_S.labels("audio").observe(time.monotonic() - started)
        loop = asyncio.get_running_loop()
        body, tail, num_samples = await loop.run_in_executor(self.encoder_threads, _encode, self.response_format, pcm)
        self.mark("encoded")
        sequence = await self._journal(0, body)
        sequence = await self._journal(sequence, tail)
        self.mark("journaled")
        audio_s = num_samples / pcm[0].sample_rate_hz
        REAL_TIME_FACTOR.labels("audio").observe((time.monotonic() - started) / audio_s)
        return {
            "audio_s": audio_s,
            "num_steps": final.usage.num_steps,
            "last_sequence": sequence - 1,
            "timings": proto_convert.timings(final.usage.timings),
        }

    async def _generate(self, replica, restarts: int) -> tuple[common_pb2.Final, list[common_pb2.PcmChunk]]:
        """The replica's Final and audio; raises ReplicaFailed when another replica should start it again."""
        metadata = ((REQUEST_ID_HEADER, self.request_id),)
        call = replica.stub.Generate(self.request, metadata=metadata)
        self.mark("dispatched")
        if restarts:
            await self.requests.set_progress(self.request_id, 0, self.request.num_steps, restarts)
        pcm: list[common_pb2.PcmChunk] = []
        try:
            messages = aiter(call)
            while (output := await next_message(messages, replica, self.policy)) is not None:
                kind = output.WhichOneof("output")
                if kind == "progress":
                    step, num_steps = output.progress.step, output.progress.num_steps
                    if step == 1:
                        self.mark("first_step")
                    await self.requests.set_progress(self.request_id, step, num_steps, restarts)
                elif kind == "audio":
                    pcm.append(output.audio.pcm)
                else:
                    check_final_for_failover(output.final, "diffusion")
                    check_final(output.final, "diffusion")
                    if not pcm:
                        raise Unavailable("diffusion finished without audio")
                    await await_status(call)
                    return output.final, pcm
            raise ReplicaFailed(f"diffusion {replica.target} ended the stream without a Final")
        except grpc.aio.AioRpcError as exc:
            raise failure_of(exc, "diffusion") or upstream_error(exc, "diffusion") from None
        finally:
            call.cancel()  # no-op when the stream ended; stops the diffusion run otherwise


def _encode(response_format: str, pcm: list[common_pb2.PcmChunk]) -> tuple[bytes, bytes, int]:
    """The encoded file as (body, tail) and its length in samples. Runs in a worker thread, so the encoder lives
    and dies there: a run cancelled meanwhile leaves the thread to finish with it. Every format goes there, wav
    too (unlike a speech chunk, see `StreamingEncoder.encode_async`), though for wav and pcm the service sends
    int16 samples already (`jobs.start_generation`) and encoding them is a copy."""
    samples = np.concatenate([chunk_to_pcm(chunk) for chunk in pcm])
    encoder = StreamingEncoder(response_format, pcm[0].sample_rate_hz, samples.shape[1])
    try:
        return encoder.encode(samples), encoder.flush(), samples.shape[0]
    finally:
        encoder.close()

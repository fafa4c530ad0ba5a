"""Contract doubles of the talker and vocoder services, for orchestration tests only.

They speak the wire contract (protos/chorus/v1/talker.proto, vocoder.proto) with trivial,
deterministic "models" so that the gateway's pipelining, ordering, error and cancellation
handling can be tested while the real engines are being built. They prove nothing about speech.

Talker: `frames_per_char` frames per character of text, sent `chunk_frames` at a time; every code
of frame f is (segment index * 100 + f). Vocoder: 1920 samples (one 12.5 Hz frame at 24 kHz) of
the constant code / 1000 per frame, so a decoded stream tells which segment and frame made it.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from chorus.v1 import common_pb2, talker_pb2, talker_pb2_grpc, vocoder_pb2, vocoder_pb2_grpc

NUM_CODEBOOKS = 16
SAMPLES_PER_FRAME = 1920
SAMPLE_RATE_HZ = 24_000


def segment_index(request_id: str) -> int:
    index = request_id.rsplit(".", 1)[-1].split("~")[0]  # a fail-over's stream id ends "~<tag>"
    return int(index) if "." in request_id else 0


class ContractTalker(talker_pb2_grpc.TalkerServicer):
    def __init__(self, frames_per_char: int = 1, chunk_frames: int = 2, delay_s: float = 0.0) -> None:
        self.frames_per_char = frames_per_char
        self.chunk_frames = chunk_frames
        self.delay_s = delay_s
        self.gate: asyncio.Event | None = None  # when set: hold after the first chunk until it opens
        self.fail_with: common_pb2.Error | None = None  # when set: a Final with this error after one chunk
        self.num_cancelled = 0
        self.num_started = 0

    async def Synthesize(self, request_iterator, context):
        first = await anext(aiter(request_iterator))
        request = first.request
        self.num_started += 1
        if not request.text.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text: must not be empty")
        base = segment_index(request.request_id) * 100
        num_frames = self.frames_per_char * len(request.text)
        is_finished = False
        try:
            for offset in range(0, num_frames, self.chunk_frames):
                count = min(self.chunk_frames, num_frames - offset)
                frames = np.repeat(np.arange(base + offset, base + offset + count, dtype="<i2"), NUM_CODEBOOKS)
                chunk = common_pb2.CodecChunk(
                    codes=frames.tobytes(),
                    num_frames=count,
                    num_codebooks=NUM_CODEBOOKS,
                    sequence=offset // self.chunk_frames,
                    frame_offset=offset,
                )
                yield talker_pb2.SynthesizeOutput(chunk=chunk)
                if self.fail_with is not None:
                    final = common_pb2.Final(reason=common_pb2.FINISH_REASON_ERROR, error=self.fail_with)
                    yield talker_pb2.SynthesizeOutput(final=final)
                    return
                if offset == 0 and self.gate is not None:
                    await self.gate.wait()
                await asyncio.sleep(self.delay_s)
            usage = common_pb2.Usage(input_tokens=len(request.text), num_frames=num_frames)
            yield talker_pb2.SynthesizeOutput(final=common_pb2.Final(reason=common_pb2.FINISH_REASON_EOS, usage=usage))
            is_finished = True
        finally:
            # Cancelled (CancelledError) or closed at a yield (GeneratorExit): the call ended early.
            if not is_finished and self.fail_with is None:
                self.num_cancelled += 1


class ContractVocoder(vocoder_pb2_grpc.VocoderServicer):
    def __init__(self) -> None:
        self.num_cancelled = 0
        self.drains_first_stream = False  # when set: its first stream ends after one chunk, as a replica draining

    async def Decode(self, request_iterator, context):
        messages = aiter(request_iterator)
        first = await anext(messages)
        assert first.WhichOneof("input") == "open"
        sample_format = first.open.format
        sequence, sample_offset = 0, 0
        is_finished = False
        try:
            async for message in messages:
                if message.WhichOneof("input") == "end_of_input":
                    break
                chunk = message.chunk
                codes = np.frombuffer(chunk.codes, "<i2").reshape(chunk.num_frames, chunk.num_codebooks)
                samples = np.repeat(codes[:, 0].astype(np.float32) / 1000.0, SAMPLES_PER_FRAME)
                data = samples.astype("<f4").tobytes()
                if sample_format != common_pb2.SAMPLE_FORMAT_PCM_F32LE:
                    data = (samples * 32767).astype("<i2").tobytes()
                pcm = common_pb2.PcmChunk(
                    data=data,
                    sample_rate_hz=SAMPLE_RATE_HZ,
                    num_channels=1,
                    format=sample_format or common_pb2.SAMPLE_FORMAT_PCM_S16LE,
                    sequence=sequence,
                    sample_offset=sample_offset,
                )
                yield vocoder_pb2.DecodeOutput(pcm=pcm)
                if self.drains_first_stream:
                    self.drains_first_stream, is_finished = False, True
                    yield vocoder_pb2.DecodeOutput(final=common_pb2.Final(reason=common_pb2.FINISH_REASON_CANCELLED))
                    return
                sequence, sample_offset = sequence + 1, sample_offset + samples.size
            yield vocoder_pb2.DecodeOutput(final=common_pb2.Final(reason=common_pb2.FINISH_REASON_COMPLETE))
            is_finished = True
        finally:
            if not is_finished:
                self.num_cancelled += 1


class FixedReplica:
    def __init__(self, target: str, stub) -> None:
        self.target = target
        self.stub = stub
        self.num_failed = 0

    async def probe(self, timeout_s: float) -> bool:
        return True


class FixedReplicas:
    """A `ReplicaSource` of one replica per backend (the doubles), counting fail-overs."""

    def __init__(self, talker_stub, vocoder_stub) -> None:
        self.replicas = {
            "talker": FixedReplica("talker", talker_stub),
            "vocoder": FixedReplica("vocoder", vocoder_stub),
        }

    async def acquire(self, kind: str, wait_s: float) -> FixedReplica:
        return self.replicas[kind]

    def release(self, replica: FixedReplica) -> None:
        pass

    def failed(self, replica: FixedReplica) -> None:
        replica.num_failed += 1


def expected_samples(texts: list[str], frames_per_char: int = 1) -> np.ndarray:
    """What the doubles decode for these segments, in order."""
    parts = []
    for index, text in enumerate(texts):
        codes = index * 100 + np.arange(frames_per_char * len(text))
        parts.append(np.repeat(codes.astype(np.float32) / 1000.0, SAMPLES_PER_FRAME))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)

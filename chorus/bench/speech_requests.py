"""One `chorus bench tts` request and the connections a client sends it on.

PCM bytes are audio seconds as they arrive; an encoded response's seconds are known once it is complete (its packets'
durations, read without decoding), and each piece of it is credited the packets it made playable, so TTFP and the
simulated player start at the first piece with audio, not at a container header. Responses are turned into timings
only after their level: demuxing in the closed loop would send each next request late (at 64 streams on an H100 host,
a request's turn in an mp3 or opus level lasted ~200 ms longer than its latency, in pcm ~20 ms)."""

from __future__ import annotations

import asyncio
import bisect
import io
import itertools
import time

import aiohttp
import av
import grpc

from chorus.bench.metrics import RequestTiming
from chorus.client.grpc_client import FORMATS
from chorus.v1 import gateway_pb2, gateway_pb2_grpc

SAMPLE_RATE_HZ = 24_000
BYTES_PER_SECOND = 2 * SAMPLE_RATE_HZ  # pcm: 16-bit mono
CONNECT_TIMEOUT_S = 30.0


def speech_body(
    model: str, text: str, seed: int, fixed_frames: int | None, voice: str, response_format: str = "pcm"
) -> dict:
    body = {"model": model, "input": text, "voice": voice, "response_format": response_format, "seed": seed}
    if fixed_frames:
        body |= {"max_frames": fixed_frames, "ignore_eos": True}
    return body


class Response:
    """One response's bytes as they arrive, turned into its RequestTiming once the level is over."""

    def __init__(self, response_format: str) -> None:
        self.response_format = response_format
        self.timing = RequestTiming(sent_at=time.perf_counter())
        self.pieces: list[tuple[float, int]] = []  # (arrival time, bytes)
        self.encoded = bytearray()

    def arrived(self, data: bytes) -> None:
        if data:
            self.pieces.append((time.perf_counter(), len(data)))
            if self.response_format != "pcm":
                self.encoded += data

    def finish(self, error: str | None = None) -> Response:
        self.timing.finished_at = time.perf_counter()
        self.timing.error = error
        return self

    def timed(self) -> RequestTiming:
        """The timing with its arrivals: each piece's seconds of audio (an encoded file's read from its packets)."""
        if self.timing.error is None and self.pieces:
            if self.response_format == "pcm":
                seconds = [num_bytes / BYTES_PER_SECOND for _, num_bytes in self.pieces]
            else:
                seconds = seconds_per_piece(bytes(self.encoded), [num_bytes for _, num_bytes in self.pieces])
            # A piece without audio (a container header) is not audio: TTFP and the player start at the first with.
            self.timing.arrivals = [(at, s) for (at, _), s in zip(self.pieces, seconds, strict=True) if s > 0]
            if self.timing.arrivals:
                self.timing.first_audio_at = self.timing.arrivals[0][0]
        return self.timing


def seconds_per_piece(data: bytes, sizes: list[int]) -> list[float]:
    """Seconds of audio each piece of a complete encoded file (`data`, arrived in pieces of `sizes` bytes) made
    playable, from its packets' durations (no decoding). A packet is playable once the bytes up to the next
    packet's start have arrived: in Ogg that is the end of its page, which a player needs whole."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        packets = [(packet.pos, packet.size, packet.duration or 0) for packet in container.demux(stream) if packet.size]
        time_base = float(stream.time_base)
    starts = sorted({pos for pos, _, _ in packets})
    piece_ends = list(itertools.accumulate(sizes))
    seconds = [0.0] * len(sizes)
    for pos, size, duration in packets:
        following = bisect.bisect_right(starts, pos)
        playable_at = max(pos + size, starts[following] if following < len(starts) else len(data))
        seconds[bisect.bisect_left(piece_ends, playable_at)] += duration * time_base
    return seconds


async def rest_request(session: aiohttp.ClientSession, body: dict) -> Response:
    response = Response(body["response_format"])
    try:
        async with session.post("/v1/audio/speech", json=body) as reply:
            response.timing.request_id = reply.headers.get("X-Request-Id")
            if reply.status != 200:
                await reply.read()
                return response.finish(f"HTTP {reply.status}")
            async for data in reply.content.iter_any():
                response.arrived(data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return response.finish(type(exc).__name__)
    return response.finish()


async def grpc_request(stub: gateway_pb2_grpc.ChorusStub, body: dict, metadata) -> Response:
    request = gateway_pb2.SpeakRequest(
        model=body["model"], input=body["input"], voice=body["voice"], seed=body["seed"],
        response_format=FORMATS[body["response_format"]], max_frames=body.get("max_frames", 0),
        ignore_eos=body.get("ignore_eos", False),
    )  # fmt: skip
    response = Response(body["response_format"])
    try:
        async for output in stub.Speak(request, metadata=metadata):
            if output.HasField("audio"):
                response.arrived(output.audio.data)
            elif output.HasField("request_id"):
                response.timing.request_id = output.request_id
    except grpc.aio.AioRpcError as exc:
        return response.finish(exc.code().name)
    return response.finish()


class SpeechClient:
    """One client process's connections: an aiohttp session, and for gRPC one channel per request in flight (as
    that many separate clients would have; one shared channel would multiplex every stream onto one connection,
    hence onto one gateway worker). Channels are connected on entry, before any level's clock starts."""

    def __init__(self, url: str, grpc_target: str, headers: dict[str, str], request_timeout_s: float, streams: int):
        self._url, self._grpc_target, self._headers = url, grpc_target, headers
        self._request_timeout_s, self._streams = request_timeout_s, streams
        self.http: aiohttp.ClientSession | None = None
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[gateway_pb2_grpc.ChorusStub] = []

    async def __aenter__(self) -> SpeechClient:
        # aiohttp (as vLLM-Omni's benchmark client): at concurrency 64 an httpx client, parsing in pure Python, took
        # most of a core and was late sending each wave's requests. One connection per request in flight.
        connector = aiohttp.TCPConnector(limit=self._streams * 2)
        timeout = aiohttp.ClientTimeout(total=self._request_timeout_s)
        self.http = aiohttp.ClientSession(self._url, headers=self._headers, timeout=timeout, connector=connector)
        return self

    async def connect_grpc(self) -> None:
        """Opens the gRPC channels (once) and waits until each is connected."""
        if self._channels:
            return
        self._channels = [
            grpc.aio.insecure_channel(self._grpc_target, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(self._streams)
        ]
        self._stubs = [gateway_pb2_grpc.ChorusStub(channel) for channel in self._channels]
        ready = asyncio.gather(*(channel.channel_ready() for channel in self._channels))
        await asyncio.wait_for(ready, min(CONNECT_TIMEOUT_S, self._request_timeout_s))

    async def __aexit__(self, *exc_info) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))
        await self.http.close()

    def send(self, transport: str, body: dict, stream: int):
        """The request of `body` over `transport` ("rest" or "grpc", on the channel of in-flight slot `stream`)."""
        if transport == "rest":
            return rest_request(self.http, body)
        return grpc_request(self._stubs[stream % len(self._stubs)], body, tuple(self._headers.items()))

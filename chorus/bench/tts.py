"""`chorus bench tts`: streaming speech through a running gateway (REST chunked PCM and/or gRPC `Speak`) at a
sweep of concurrency levels; each level keeps exactly `concurrency` requests in flight until its request count
is done, and says where the stack's time went meanwhile when its processes are on this machine (`breakdown`; off
with `--no-breakdown`). With `--chaos N` a talker or vocoder replica is killed every N seconds meanwhile (`chaos`).

`--format` picks the response format (pcm by default). PCM bytes are audio seconds as they arrive; an encoded
response's seconds are known once it is complete (its packets' durations, read without decoding), and each piece
of it is credited the packets it made playable; TTFP and the simulated player start at the first piece with audio,
not at a container header. Encoded responses are read after their level ends: one client process standing in for
many, it would otherwise spend the level's time demuxing, and send each next request late (at 64 streams on an
H100 host, a request's turn in an mp3 or opus level lasted ~200 ms longer than its latency, in pcm ~20 ms).
Failed requests are counted by kind (`errors`: the HTTP status or gRPC code), and the first few of each kind keep
their request id and the stack's message (`error_examples`). Each level's `ttfp_stages` splits the TTFP of a sample
of its requests at the stages their runs marked (`chorus.bench.ttfp`), `slowest_ttfp_stages` that of its slowest
5 %, `underrun_stages` times the pieces that players ran dry waiting for, `latency_stages` splits their latency (to
the last byte) at the end of their frames and their PCM, and `client_cpu_s_per_s` is this process's CPU time over
the level's wall time (on an H100 host, 0.24 at 256 gRPC streams and 0.10 over REST: one client process keeps up)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import io
import itertools
import json
import time
from collections.abc import Callable

import aiohttp
import av
import grpc

from chorus.bench.breakdown import StepBreakdown
from chorus.bench.chaos import Chaos
from chorus.bench.metrics import RequestTiming, steady_quarters, summarize
from chorus.bench.prompts import SPEECH
from chorus.bench.report import checked
from chorus.bench.ttfp import level_latency_stages, level_ttfp_stages, level_underrun_stages, slowest
from chorus.client.grpc_client import DONE_REASONS, FORMATS
from chorus.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

SAMPLE_RATE_HZ = 24_000
BYTES_PER_SECOND = 2 * SAMPLE_RATE_HZ  # pcm: 16-bit mono
ERROR_MESSAGE_CHARS = 300  # of an error's message kept in the results
CONNECT_TIMEOUT_S = 30.0  # for the gRPC channels, before the first level


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

    def finish(self, error: str | None = None, message: str | None = None) -> Response:
        self.timing.finished_at = time.perf_counter()
        self.timing.error = error
        self.timing.error_message = message[:ERROR_MESSAGE_CHARS] if message else None
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
                return response.finish(f"HTTP {reply.status}", error_message(await reply.read()))
            async for data in reply.content.iter_any():
                response.arrived(data)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return response.finish(type(exc).__name__, str(exc))
    return response.finish()


def error_message(body: bytes) -> str:
    """The message of an OpenAI error envelope (`{"error": {"message": …}}`), else the body as text."""
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")


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
            elif output.final.reason not in DONE_REASONS:  # failed after it began: an error, not a short answer
                reason = common_pb2.FinishReason.Name(output.final.reason).removeprefix("FINISH_REASON_")
                return response.finish(output.final.error.code or reason, output.final.error.message)
    except grpc.aio.AioRpcError as exc:
        return response.finish(exc.code().name, exc.details())
    return response.finish()


async def run_level(
    send: Callable[[int], object],
    concurrency: int,
    num_requests: int,
    on_done,
    chaos: Chaos | None = None,
    steps: StepBreakdown | None = None,
) -> tuple[dict, list[RequestTiming]]:
    """`num_requests` calls of `send(index)` (a coroutine giving its `Response`) with `concurrency` in flight;
    the level's summary (with the fail-overs `chaos` caused and the breakdown of `steps`, started before) and its
    requests' timings."""
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int) -> Response:
        async with slots:
            response = await send(index)
        on_done()
        return response

    cpu_started, started = time.process_time(), time.perf_counter()
    responses = await asyncio.gather(*(one(index) for index in range(num_requests)))
    wall_s = time.perf_counter() - started
    # Whether the figures are the stack's or this client's: near 1, the client was the bottleneck.
    client_cpu_s_per_s = round((time.process_time() - cpu_started) / wall_s, 3)
    breakdown = await steps.finish() if steps is not None else None  # before reading the responses: off the clock
    timings = await asyncio.to_thread(lambda: [response.timed() for response in responses])
    summary = summarize(timings, wall_s) | {"steady_quarters": steady_quarters(timings, started)}
    summary["client_cpu_s_per_s"] = client_cpu_s_per_s
    if chaos is not None:
        summary["chaos"] = chaos.summary(timings)
    if breakdown is not None:
        summary["breakdown"] = breakdown
    return summary, timings


async def connect(channels: list[grpc.aio.Channel], target: str) -> None:
    """Every channel connected before the first level, as a long-lived client's are: left to connect at their
    first call, the channels a level adds (192 at 256 after 64) connected inside its burst."""
    try:
        await asyncio.wait_for(asyncio.gather(*(channel.channel_ready() for channel in channels)), CONNECT_TIMEOUT_S)
    except TimeoutError:
        message = f"the gateway's gRPC port {target} took no connection in {CONNECT_TIMEOUT_S:.0f} s"
        raise ConnectionError(message) from None


async def run(args, progress) -> list[dict]:
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    metadata = tuple(headers.items())
    # aiohttp (as vLLM-Omni's benchmark client): at concurrency 64 an httpx client, parsing in pure Python, took
    # most of a core and was late sending each wave's requests. One connection per request in flight, as that
    # many separate clients would have; for gRPC too (one shared channel would multiplex every stream onto one
    # connection, hence onto one gateway worker).
    connector = aiohttp.TCPConnector(limit=max(args.concurrency) * 2)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout_s)
    channels = [
        grpc.aio.insecure_channel(args.grpc_target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(args.concurrency) if args.transport in ("grpc", "both") else 0)
    ]
    levels = []
    async with (
        aiohttp.ClientSession(args.url, headers=headers, timeout=timeout, connector=connector) as http,
        contextlib.AsyncExitStack() as open_channels,
    ):
        for channel in channels:
            await open_channels.enter_async_context(channel)
        stubs = [gateway_pb2_grpc.ChorusStub(channel) for channel in channels]
        if args.model is None:
            async with http.get("/v1/models") as reply:
                model = (await reply.json())["data"][0]["id"]
        else:
            model = args.model
        await connect(channels, args.grpc_target)
        texts = [SPEECH[name] for name in args.prompts]
        chaos = Chaos(http, args.chaos) if args.chaos else None
        steps = None if args.no_breakdown else StepBreakdown(http, args.url, args.grpc_target)
        if steps is not None:
            open_channels.push_async_callback(steps.close)
        killing = asyncio.create_task(chaos.run()) if chaos is not None else None
        transports = ("rest", "grpc") if args.transport == "both" else (args.transport,)
        for transport, concurrency in itertools.product(transports, args.concurrency):
            num_requests = args.requests_per_level or max(8, 2 * concurrency)

            def send(index: int, transport=transport, concurrency=concurrency):
                body = speech_body(model, texts[index % len(texts)], index, args.fixed_frames, args.voice, args.format)
                if transport == "rest":
                    return rest_request(http, body)
                return grpc_request(stubs[index % concurrency], body, metadata)

            counter = progress.level(f"{transport} c={concurrency}", num_requests)
            if steps is not None:
                await steps.start()
            summary, timings = await run_level(send, concurrency, num_requests, counter, chaos, steps)
            summary["ttfp_stages"] = await level_ttfp_stages(http, timings)  # read after the level, not timed
            summary["slowest_ttfp_stages"] = await level_ttfp_stages(http, timings, pick=slowest)
            summary["underrun_stages"] = await level_underrun_stages(http, timings)
            summary["latency_stages"] = await level_latency_stages(http, timings)
            levels.append({"transport": transport, "concurrency": concurrency, "format": args.format} | summary)
            progress.done(levels[-1])
        if killing is not None:
            killing.cancel()
    return levels


TARGETS = (  # (concurrency, metric path, bound, "max" or "min"): issue 18's targets on one H100
    (1, ("ttfp_ms", "p50"), 20.0, "max"),
    (1, ("rtf", "p50"), 0.05, "max"),
    (64, ("audio_s_per_s",), 700.0, "min"),
    (64, ("ttfp_ms", "p95"), 250.0, "max"),
    (64, ("underrun_events",), 0, "max"),
    (256, ("audio_s_per_s",), 1000.0, "min"),
    (256, ("ttfp_ms", "p95"), 500.0, "max"),
    (256, ("underrun_events",), 0, "max"),
)


def check_targets(levels: list[dict]) -> list[dict]:
    """Each target against every measured pcm level of its concurrency (per transport). The targets are pcm's: an
    encoded format's throughput is judged against pcm's on the same stack (within 10 %), not against these bounds."""
    checks = []
    for concurrency, path, bound, kind in TARGETS:
        for level in (level for level in levels if level["concurrency"] == concurrency and level["format"] == "pcm"):
            value, met = checked(level, path, bound, kind)
            checks.append({"transport": level["transport"], "concurrency": concurrency, "metric": ".".join(path),
                           "value": value, "bound": bound, "kind": kind, "met": met})  # fmt: skip
    return checks

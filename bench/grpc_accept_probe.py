"""`python bench/grpc_accept_probe.py [--servers 1,4] [--rounds 3]`: how fast one process's grpc.aio servers start
the handlers of a burst of new streams.

An experiment kept for its answer, not a serving path. A grpc.aio server accepts its calls one at a time: it asks
the core for a call, awaits it (an event-loop round trip), starts its handler, then asks for the next. A burst of
256 speech requests opens 512 streams on the speech process (a talker and a vocoder stream each), so the last
handler starts only after 512 such round trips, longer when the loop is busy relaying running streams. Here one
process runs K servers on one port (SO_REUSEPORT, as `ServiceHost` did with `grpc_servers` K), with and without
its loop kept busy by short callbacks; another process opens 512 bidi streams at once over 16 connections (as 16
gateway workers do) and each sends one message. Reported: when each handler started, from the burst's start
(p50, p95, last), per K and load, over `--rounds` rounds. Writes `bench/results/grpc-accept-<stamp>.json`.

Answer (the 2-core CPU box, grpcio 1.85, client and server sharing its two cores; `grpc-accept-20261129-150708.json`,
three rounds): with the server's loop otherwise idle, the last of the 512 handlers started after 348, 416, 375 ms
with one server and 128, 285, 341 ms with four (p50 215–245 against 73–238 ms); with its loop kept busy the two
were alike (last 718–985 against 759–964 ms): there the box's two cores, not the intake, were the limit. On an H200
host (16 cores), though, four servers on the speech port did not shorten the speech stack's tail at 256 streams: in
three alternating rounds of two stacks on one H200 the slowest 5 % spent 298–732 ms on their way into the talker
engine with four servers, 158–456 ms with one, and `grpc_servers` was taken out again (docs/performance-log.md,
2026-11-29, thirty-third session). Nor did half the streams: with one stream a request (the talker's process decoding
its frames itself, 8420864, reverted) the slowest 5 % waited 71–595 ms for the talker's handler against 132–512 ms
with two, in five alternating rounds (thirty-fourth session).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from pathlib import Path

import grpc

from chorus.bench.report import REPO, commit

STREAMS = 512
CONNECTIONS = 16
BUSY_CALLBACKS = 50  # queued per loop iteration while loaded, each a few tens of microseconds of Python


def _handler(started: list[float]) -> grpc.RpcMethodHandler:
    async def echo(requests, context):
        started.append(time.time())
        async for message in requests:
            yield message
            return

    return grpc.stream_stream_rpc_method_handler(echo)


async def _keep_busy() -> None:
    loop = asyncio.get_running_loop()
    while True:
        for _ in range(BUSY_CALLBACKS):
            loop.call_soon(sum, range(300))
        await asyncio.sleep(0)


async def _serve(num_servers: int, busy: bool, port_out, starts_out) -> None:
    started: list[float] = []
    handlers = grpc.method_handlers_generic_handler("probe.Probe", {"Echo": _handler(started)})
    servers, port = [], 0
    for _ in range(num_servers):
        server = grpc.aio.server(options=[("grpc.so_reuseport", 1)])
        server.add_generic_rpc_handlers((handlers,))
        port = server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append(server)
    load = asyncio.create_task(_keep_busy()) if busy else None
    port_out.put(port)
    while len(started) < STREAMS:
        await asyncio.sleep(0.02)
    starts_out.put(started)
    if load is not None:
        load.cancel()
    await asyncio.gather(*(server.stop(5.0) for server in servers))  # the streams under way end first


def _server_process(num_servers: int, busy: bool, port_out, starts_out) -> None:
    asyncio.run(_serve(num_servers, busy, port_out, starts_out))


async def _burst(port: int) -> float:
    """Opens STREAMS streams at once over CONNECTIONS connections; returns when the burst began (time.time())."""
    own_connection = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=own_connection) for _ in range(CONNECTIONS)]
    for channel in channels:
        await channel.channel_ready()

    async def one(index: int) -> None:
        call = channels[index % CONNECTIONS].stream_stream("/probe.Probe/Echo")()
        await call.write(b"x")
        await call.read()
        call.cancel()

    began = time.time()
    await asyncio.gather(*(one(index) for index in range(STREAMS)))
    await asyncio.gather(*(channel.close() for channel in channels))
    return began


def measure(num_servers: int, busy: bool) -> dict:
    port_out, starts_out = multiprocessing.Queue(), multiprocessing.Queue()
    server = multiprocessing.Process(target=_server_process, args=(num_servers, busy, port_out, starts_out))
    server.start()
    began = asyncio.run(_burst(port_out.get(timeout=30)))
    delays_ms = sorted((at - began) * 1000 for at in starts_out.get(timeout=60))
    server.join(timeout=30)
    return {
        "p50_ms": round(statistics.median(delays_ms), 1),
        "p95_ms": round(delays_ms[int(0.95 * len(delays_ms))], 1),
        "last_ms": round(delays_ms[-1], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="1,4", help="server counts to compare, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args()
    rows = []
    for round_index in range(args.rounds):
        for busy in (False, True):
            for num_servers in (int(count) for count in args.servers.split(",")):
                row = {"round": round_index + 1, "servers": num_servers, "busy_loop": busy} | measure(num_servers, busy)
                print(json.dumps(row), flush=True)
                rows.append(row)
    report = {"benchmark": "grpc-accept", "commit": commit(), "grpcio": grpc.__version__, "streams": STREAMS,
              "connections": CONNECTIONS, "rows": rows}  # fmt: skip
    path = args.out / f"grpc-accept-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

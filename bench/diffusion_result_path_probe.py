"""`python bench/diffusion_result_path_probe.py` (a CPU is enough): where the time goes between the diffusion engine's
end of decode and the gateway's receipt of the Final, for one 10 s stereo clip (3.5 MB of float32) on loopback.

An experiment kept for its answer, not a serving path. A diffusion service runs in a child process (tiny model on
the CPU, each request held to the tiny window, its decode swapped for a seeded 10 s clip in the runner's layout);
this process runs the gateway's `GenerationRun._generate` against it, one request at a time. Each stage is ms after
the end of the decode: the service's event loop has the audio, has built its first message, has written the audio,
has the Final; the gateway has the audio, has the Final. Page faults are counted in each process over the request.
Prints the medians and writes them, with every request's stages, to `bench/results/diffusion-result-path-<stamp>.json`.

Issue 20, on a 2-core CPU shared with other work (medians of the last 23 of 30 requests; the figures for 7608cc9
from this script with its decode returning the (channels, samples) layout of then and no heap settings): at 7608cc9
the gateway had the Final 25.4 ms after the decode, of which 13.5 ms building the message (a host transpose and a
nested protobuf merge), with 6160 page faults in the service and 2526 in the gateway; with the decode transposed on
the device, the message filled in place and `chorus.runtime.heap` in both processes, 6.9 ms (message 1.2 ms; 0 and
5 page faults). The rest is gRPC's: serializing, copying into its slices, sending, receiving, parsing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from chorus.bench.report import REPO, commit

CLIP_SAMPLES = 441_000  # 10 s at 44.1 kHz


def _page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


async def serve(port: int) -> None:
    """The child: a diffusion service that prints one JSON line of stamps per request."""
    import torch

    import chorus.diffusion.service as service_module
    from chorus.diffusion.config import DiffusionConfig
    from chorus.diffusion.engine.request import AudioOutput, Finished
    from chorus.runtime.host import ServiceHost

    clip = torch.randn(2, CLIP_SAMPLES, generator=torch.Generator().manual_seed(0)).clamp(-1, 1)
    stamps: dict[str, float] = {}
    output_messages, generation_request = service_module.output_messages, service_module.generation_request

    def stamped_output_messages(event):
        if isinstance(event, Finished):
            stamps["service_final"] = time.monotonic()
            stamps["service_faults"] = _page_faults() - stamps.pop("faults_at_decode")
            print(json.dumps(stamps), flush=True)
            stamps.clear()
        if not isinstance(event, AudioOutput):
            yield from output_messages(event)
            return
        stamps["service_audio"] = time.monotonic()
        for message in output_messages(event):
            stamps.setdefault("service_message_built", time.monotonic())
            yield message
        stamps["service_audio_written"] = time.monotonic()

    def tiny_window_request(limits, message, deadline_s=None):
        message.duration_s = min(message.duration_s, limits.max_duration_s)
        return generation_request(limits, message, deadline_s)

    def decode(state):
        waveform = clip.T.contiguous().T  # the runner's layout: interleaved by channel in memory
        stamps["decoded"], stamps["faults_at_decode"] = time.monotonic(), _page_faults()
        return waveform

    service_module.output_messages, service_module.generation_request = stamped_output_messages, tiny_window_request
    config = DiffusionConfig(device="cpu", port=port, metrics_port=-1, grace_s=1.0)
    service = service_module.DiffusionService(config)
    host = ServiceHost(config, service)  # held: the server stops once its host is collected
    await host.start()
    service.engine.runner.decode = decode
    print("ready", flush=True)
    await asyncio.Event().wait()


class _NoRecord:
    async def set_progress(self, *args) -> None:
        pass


async def measure(port: int, num_requests: int, child: subprocess.Popen) -> list[dict]:
    import chorus.gateway.generation_run as generation_run
    from chorus.gateway.backends import Replica
    from chorus.runtime.heap import keep_large_buffers_mapped
    from chorus.v1 import diffusion_pb2

    keep_large_buffers_mapped()  # as GatewayService.start does
    received: dict[str, float] = {}
    next_message = generation_run.next_message

    async def stamped_next_message(*args, **kwargs):
        message = await next_message(*args, **kwargs)
        if message is not None and message.WhichOneof("output") in ("audio", "final"):
            received.setdefault("gateway_" + message.WhichOneof("output"), time.monotonic())
        return message

    generation_run.next_message = stamped_next_message
    replica = Replica("diffusion", "chorus.v1.Diffusion", f"127.0.0.1:{port}")
    rows = []
    for index in range(num_requests):
        request = diffusion_pb2.GenerateRequest(request_id=f"probe-{index}", prompt="rain", num_steps=2, seed=index)
        run = generation_run.GenerationRun(_NoRecord(), None, None, request, None, "wav")
        received.clear()
        faults_before = _page_faults()
        await run._generate(replica, 0)
        gateway_faults = _page_faults() - faults_before
        stamps = json.loads(await asyncio.to_thread(child.stdout.readline)) | received
        decoded = stamps.pop("decoded")
        row = {name: (at - decoded) * 1000 for name, at in stamps.items() if name != "service_faults"}
        rows.append(row | {"service_faults": stamps["service_faults"], "gateway_faults": gateway_faults})
    await replica.channel.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--port", type=int, default=50993)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port))
        return
    command = [sys.executable, __file__, "--serve", "--port", str(args.port)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("the diffusion service did not start")
        rows = asyncio.run(measure(args.port, args.requests, child))
    finally:
        child.terminate()
        child.wait()
    rows = rows[len(rows) // 4 :]  # the first requests warm both processes up
    names = sorted(rows[0], key=lambda name: statistics.median(row[name] for row in rows))
    medians = {name: round(statistics.median(row[name] for row in rows), 2) for name in names}
    for name in names:
        values = [row[name] for row in rows]
        unit = "" if name.endswith("faults") else " ms"
        print(f"{name:24s} p50 {medians[name]:8.1f}{unit}  min {min(values):8.1f}  max {max(values):8.1f}")
    settings = {"requests": args.requests, "port": args.port}
    results = {"benchmark": "diffusion-result-path", "commit": commit(), "settings": settings, "p50": medians,
               "requests": rows}  # fmt: skip
    path = args.out / f"diffusion-result-path-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

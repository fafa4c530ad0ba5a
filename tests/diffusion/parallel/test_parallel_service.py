"""The diffusion service in a parallel mode: starts its workers, serves over gRPC, stops them all."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import grpc
import numpy as np

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.service import DiffusionService
from chorus.runtime.host import ServiceHost
from chorus.v1 import common_pb2, diffusion_pb2, diffusion_pb2_grpc
from chorus.wire import chunk_to_pcm

REQUEST = {"prompt": "rain on a tin roof", "duration_s": 0.5, "num_steps": 3, "seed": 3, "num_outputs": 2}


async def _serve_one(config: DiffusionConfig) -> tuple[np.ndarray, common_pb2.Final, list]:
    service = DiffusionService(config)
    host = ServiceHost(config, service)
    await host.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.port}") as channel:
            stub = diffusion_pb2_grpc.DiffusionStub(channel)
            messages = [m async for m in stub.Generate(diffusion_pb2.GenerateRequest(**REQUEST))]
            workers = list(service.parallel_group.workers) if service.parallel_group else []
            for worker in workers:
                with open(f"/proc/{worker.pid}/environ", "rb") as environ:
                    assert b"NCCL_NVLS_ENABLE=0\0" in environ.read(), "workers inherit the service's environment"
    finally:
        await host.stop()
    samples = np.concatenate([chunk_to_pcm(m.audio.pcm) for m in messages if m.HasField("audio")])
    assert all(worker.poll() is not None for worker in workers), "a worker outlived the service"
    return samples, messages[-1].final, workers


async def test_parallel_service_serves_what_one_process_serves_and_stops_its_workers(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    common = {"device": "cpu", "dtype": "float32", "metrics_port": -1, "grace_s": 1.0}
    expected, _, _ = await _serve_one(DiffusionConfig(**common))
    samples, final, workers = await _serve_one(DiffusionConfig(**common, parallel="cfg+tp", parallel_degree=4))
    assert len(workers) == 3 and all(worker.returncode == 0 for worker in workers)
    assert final.reason == common_pb2.FINISH_REASON_COMPLETE and final.usage.num_steps == 3
    assert samples.shape == expected.shape and np.abs(samples).max() > 0
    np.testing.assert_allclose(samples, expected, atol=1e-4)


_ORPHAN_PARENT = """
import time
from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.loader import load_models
from chorus.diffusion.parallel.group import ParallelGroup
config = DiffusionConfig(device="cpu", dtype="float32", parallel="sp", parallel_degree=2)
group = ParallelGroup.launch(config, load_models("tiny", device="cpu", dtype="float32"))
print(*(worker.pid for worker in group.workers), flush=True)
time.sleep(600)
"""


def test_workers_exit_when_the_service_process_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN_PARENT], stdout=subprocess.PIPE, text=True)
    try:
        worker_pids = [int(pid) for pid in parent.stdout.readline().split()]
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    assert len(worker_pids) == 1
    deadline_s = time.monotonic() + 10
    while time.monotonic() < deadline_s and _is_running(worker_pids[0]):
        time.sleep(0.1)
    assert not _is_running(worker_pids[0])


def _is_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (the orphan's reaper may not have collected it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

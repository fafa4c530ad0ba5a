"""A parallel diffusion group on one host: rank 0 is the service process, ranks 1… are worker processes.

    group = ParallelGroup.launch(config, models)   # models: rank 0's, already loaded
    velocity = group.denoiser(latents, timesteps, cross_context, global_context)   # as StableAudioDenoiser
    group.close()

Workers are `python -m chorus.diffusion.parallel.worker` subprocesses: they inherit this process's
environment (NCCL_* included), take GPU `rank` on CUDA, and exit when this process goes away. Ranks meet
through a TCP store that rank 0 opens on a free local port; NCCL on CUDA, gloo on CPU. A worker that dies
takes rank 0 down with it (its collectives could never finish), so the service restarts as a whole.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import subprocess
import sys
import threading

import torch
import torch.distributed as dist

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.graphs import GraphedDenoiser
from chorus.diffusion.loader import StableAudioModels, resolve_device
from chorus.diffusion.parallel.cfg_parallel import RankDenoiser
from chorus.diffusion.parallel.plan import ParallelConfigError, ParallelPlan, make_plan
from chorus.diffusion.parallel.sequence_parallel import SequenceParallelDenoiser
from chorus.diffusion.parallel.tensor_parallel import shard_transformer

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT = datetime.timedelta(minutes=10)
# Workers wait in a broadcast while the service is idle, for as long as it stays idle.
COLLECTIVE_TIMEOUT = datetime.timedelta(days=365)
STOP_TIMEOUT_S = 30.0
WATCH_INTERVAL_S = 1.0


def plan_for(config: DiffusionConfig, models: StableAudioModels) -> ParallelPlan:
    """The config's plan, checked against the DiT's heads and the host's GPUs (ParallelConfigError)."""
    model_config = models.transformer.config
    plan = make_plan(
        config.parallel,
        config.parallel_degree,
        model_config.num_attention_heads,
        model_config.num_key_value_attention_heads,
    )
    if models.device.type == "cuda" and torch.cuda.device_count() < plan.world_size:
        raise ParallelConfigError(
            f"parallel_degree: {plan.world_size} processes need as many GPUs, this host has {torch.cuda.device_count()}"
        )
    return plan


def rank_device(device: str, rank: int) -> torch.device:
    """GPU `rank` when `device` resolves to CUDA, else the CPU."""
    resolved = resolve_device(device)
    return torch.device("cuda", rank) if resolved.type == "cuda" else resolved


def join_group(rank: int, world_size: int, device: torch.device, store: dist.Store) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=COLLECTIVE_TIMEOUT,
        device_id=device if device.type == "cuda" else None,
    )


@torch.no_grad()
def build_rank_denoiser(
    models: StableAudioModels, plan: ParallelPlan, rank: int, config: DiffusionConfig
) -> RankDenoiser:
    """Collective (every rank calls it): copies rank 0's DiT weights to all ranks, then shards this rank's.
    `models` must be as loaded (no StableAudioDenoiser built on them yet), so every rank's state dict has
    the same tensors in the same order.

    With CFG-parallel alone (no collective inside a forward) each rank replays CUDA graphs of its share of
    the rows, compiled with config.compile_dit, as one GPU does; tp and sp ranks run eagerly."""
    assert all(getattr(block.attn1, "to_qkv", None) is None for block in models.transformer.transformer_blocks)
    for tensor in models.transformer.state_dict().values():
        dist.broadcast(tensor, src=0)
    dist.broadcast(models.time_frequencies, src=0)
    inner_group = None
    if plan.cfg_degree > 1 and plan.inner_degree > 1:
        # Every rank creates every group, in the same order, as new_group requires.
        groups = [dist.new_group(plan.inner_group_ranks(g)) for g in range(plan.cfg_degree)]
        inner_group = groups[plan.cfg_rank(rank)]
    use_graphs = plan.inner_degree == 1 and config.use_cuda_graphs and models.device.type == "cuda"
    denoiser = StableAudioDenoiser(
        models.transformer,
        models.time_frequencies,
        compile_blocks=use_graphs and config.compile_dit,
        compile_mode=config.compile_mode,
        attention_backend=config.attention_backend,
    )
    if use_graphs:
        # A step's rows (up to 2 per sample with CFG) split evenly over the CFG groups.
        max_rows = -(-2 * config.max_batch_size // plan.cfg_degree)
        return RankDenoiser(GraphedDenoiser.captured(denoiser, models, max_rows), plan, rank, models.device)
    inner_rank = plan.inner_rank(rank)
    if plan.tp_degree > 1:
        shard_transformer(models.transformer, inner_rank, plan.tp_degree, inner_group)
    if plan.sp_degree > 1:
        return RankDenoiser(
            SequenceParallelDenoiser(denoiser, inner_rank, plan.sp_degree, inner_group), plan, rank, models.device
        )
    return RankDenoiser(denoiser, plan, rank, models.device)


class ParallelGroup:
    """Rank 0's handle on a running group: its denoiser and the worker processes."""

    def __init__(self, denoiser: RankDenoiser, workers: list[subprocess.Popen], is_closing: threading.Event) -> None:
        self.denoiser = denoiser
        self.workers = workers
        self._is_closing = is_closing

    @classmethod
    def launch(cls, config: DiffusionConfig, models: StableAudioModels) -> ParallelGroup:
        """Starts ranks 1… and forms the group with this process as rank 0. `models` must be on
        rank_device(config.device, 0). Blocks until every worker has loaded its model."""
        plan = plan_for(config, models)
        store = dist.TCPStore(
            "127.0.0.1", 0, plan.world_size, is_master=True, timeout=STARTUP_TIMEOUT, wait_for_workers=False
        )
        workers = [_start_worker(config, rank, plan.world_size, store.port) for rank in range(1, plan.world_size)]
        is_closing = threading.Event()
        # From here on: a worker that fails while loading would leave this rank waiting for it.
        threading.Thread(
            target=_watch_workers, args=(workers, is_closing), name="diffusion-parallel-watch", daemon=True
        ).start()
        try:
            join_group(0, plan.world_size, models.device, store)
            denoiser = build_rank_denoiser(models, plan, 0, config)
        except BaseException:
            is_closing.set()
            _end(workers)
            raise
        logger.info("parallel diffusion group up: %s over %d processes", config.parallel, plan.world_size)
        return cls(denoiser, workers, is_closing)

    def close(self) -> None:
        """Stops the workers (after the step in flight) and leaves the group; no process outlives it."""
        self._is_closing.set()
        self.denoiser.stop()
        _end(self.workers)
        dist.destroy_process_group()


def _watch_workers(workers: list[subprocess.Popen], is_closing: threading.Event) -> None:
    # A lost rank leaves rank 0 waiting in a collective for good: the process cannot serve any more, so
    # it exits and its supervisor (Kubernetes, compose) restarts the whole group.
    while not is_closing.wait(WATCH_INTERVAL_S):
        for worker in workers:
            if worker.poll() is not None and not is_closing.is_set():
                logger.critical("parallel diffusion worker %d exited (%s); exiting", worker.pid, worker.returncode)
                os._exit(1)


def _start_worker(config: DiffusionConfig, rank: int, world_size: int, store_port: int) -> subprocess.Popen:
    spec = {
        "config": dataclasses.asdict(config),
        "rank": rank,
        "world_size": world_size,
        "store_port": store_port,
        "parent_pid": os.getpid(),
    }
    return subprocess.Popen([sys.executable, "-m", "chorus.diffusion.parallel.worker", json.dumps(spec)])


def _end(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        try:
            worker.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("parallel diffusion worker %d did not stop; killing it", worker.pid)
            worker.kill()
            worker.wait()

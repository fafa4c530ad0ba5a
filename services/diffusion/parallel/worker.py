"""Entry point of a parallel diffusion worker (rank > 0), started by chorus.diffusion.parallel.group.

    python -m chorus.diffusion.parallel.worker '{"config": {...}, "rank": 1, "world_size": 2, ...}'

It joins the group, loads the same model as rank 0 (whose weights it then receives), and serves steps
until rank 0 stops it. It exits as soon as its parent is gone, so a killed service leaves no worker behind.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import torch.distributed as dist

from chorus.diffusion.config import DiffusionConfig
from chorus.diffusion.loader import load_models
from chorus.diffusion.parallel.group import STARTUP_TIMEOUT, build_rank_denoiser, join_group, rank_device
from chorus.diffusion.parallel.plan import make_plan

PARENT_POLL_S = 0.5


def _exit_with_parent(parent_pid: int) -> None:
    # Reparenting changes getppid(); os._exit because the main thread may be blocked inside a collective.
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    threading.Thread(target=_exit_with_parent, args=(spec["parent_pid"],), daemon=True).start()
    config = DiffusionConfig(**spec["config"])
    rank, world_size = spec["rank"], spec["world_size"]
    device = rank_device(config.device, rank)
    store = dist.TCPStore("127.0.0.1", spec["store_port"], world_size, is_master=False, timeout=STARTUP_TIMEOUT)
    join_group(rank, world_size, device, store)
    models = load_models(config.model, config.load_format, str(device), config.dtype)
    model_config = models.transformer.config
    plan = make_plan(
        config.parallel, world_size, model_config.num_attention_heads, model_config.num_key_value_attention_heads
    )
    build_rank_denoiser(models, plan, rank, config).serve()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])

"""The per-step protocol of a parallel group, and CFG-parallel: the DiT rows of a step split over CFG groups.

Rank 0 (the engine's) calls `RankDenoiser` like a StableAudioDenoiser; every other rank sits in `serve`.
Per step rank 0 broadcasts a small header (batch shape) and then all inputs packed into one fp32 buffer;
each CFG group takes its contiguous share of the rows (the runner puts conditional rows first and their
unconditional rows after, so at degree 2 with every sample guided one group runs the conditional half and
the other the unconditional half), its inner ranks (tp or sp) shard that forward, and one all-gather
returns every group's rows. A header with command STOP ends the workers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from chorus.diffusion.parallel.plan import ParallelPlan

Denoise = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

_STEP, _STOP = 1, 0
_HEADER_SIZE = 8  # command, rows, latent channels, latent frames, cross tokens, cross dim, global tokens, global dim


class RankDenoiser:
    """One rank's share of each DiT forward; `denoise` is this rank's (possibly sharded) denoiser."""

    def __init__(self, denoise: Denoise, plan: ParallelPlan, rank: int, device: torch.device) -> None:
        self.denoise = denoise
        self.plan = plan
        self.rank = rank
        self.device = device

    @torch.inference_mode()
    def __call__(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        cross_context: torch.Tensor,
        global_context: torch.Tensor,
    ) -> torch.Tensor:
        """On rank 0: the whole batch's velocity (B, C, L) in the model dtype; arguments as StableAudioDenoiser."""
        assert self.rank == 0
        shape = (_STEP, *latents.shape, *cross_context.shape[1:], *global_context.shape[1:])
        header = torch.tensor(shape, dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        inputs = (latents, timesteps, cross_context, global_context)
        payload = torch.cat([x.to(self.device, torch.float32).reshape(-1) for x in inputs])
        dist.broadcast(payload, src=0)
        return self._forward(latents, timesteps, cross_context, global_context)

    @torch.inference_mode()
    def serve(self) -> None:
        """On ranks > 0: runs steps until rank 0 calls `stop`."""
        assert self.rank != 0
        header = torch.empty(_HEADER_SIZE, dtype=torch.int64, device=self.device)
        while True:
            dist.broadcast(header, src=0)
            command, rows, channels, frames, cross_tokens, cross_dim, global_tokens, global_dim = header.tolist()
            if command == _STOP:
                return
            shapes = [torch.Size(s) for s in ((rows, channels, frames), (rows,), (rows, cross_tokens, cross_dim))]
            shapes.append(torch.Size((rows, global_tokens, global_dim)))
            payload = torch.empty(sum(s.numel() for s in shapes), device=self.device)
            dist.broadcast(payload, src=0)
            parts = payload.split([s.numel() for s in shapes])
            inputs = [part.view(s) for part, s in zip(parts, shapes, strict=True)]
            self._forward(*inputs)

    def stop(self) -> None:
        """On rank 0: releases the workers from `serve`."""
        assert self.rank == 0
        dist.broadcast(torch.zeros(_HEADER_SIZE, dtype=torch.int64, device=self.device), src=0)

    def _forward(self, latents, timesteps, cross_context, global_context) -> torch.Tensor:
        num_groups = self.plan.cfg_degree
        if num_groups == 1:
            return self.denoise(latents, timesteps, cross_context, global_context)
        num_rows = latents.shape[0]
        rows_per_group = -(-num_rows // num_groups)
        first = self.plan.cfg_rank(self.rank) * rows_per_group
        # Groups past the last row still run (and gather) zero rows of the same shape: collectives need equal sizes.
        inputs = (latents, timesteps, cross_context, global_context)
        padded = [_pad_rows(x, num_groups * rows_per_group) for x in inputs]
        local = self.denoise(*(x[first : first + rows_per_group] for x in padded))
        gathered = [torch.empty_like(local) for _ in range(self.plan.world_size)]
        dist.all_gather(gathered, local.contiguous())
        leaders = [gathered[self.plan.inner_group_ranks(g)[0]] for g in range(num_groups)]
        return torch.cat(leaders)[:num_rows]


def _pad_rows(tensor: torch.Tensor, num_rows: int) -> torch.Tensor:
    padding = torch.zeros((num_rows - tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, padding])

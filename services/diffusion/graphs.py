"""CUDA graphs of the DiT forward, one per batch-row bucket, replayed instead of the eager forward.

At batch 2 (one request with CFG) the eager DiT is bound by Python and kernel launches (~34 ms per
forward on an H100 against ~11 ms of GPU work), so replaying a captured graph is what makes one request
fast. Rows are padded up to the nearest bucket; rows never interact in the DiT, so padding only costs
compute. Buckets are captured largest first into one shared memory pool. Batches larger than the largest
bucket run eagerly, as does everything on a machine without CUDA.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.loader import StableAudioModels
from chorus.runtime.streams import capture_graph

logger = logging.getLogger(__name__)


def row_buckets(max_rows: int) -> list[int]:
    """Powers of two below `max_rows`, then `max_rows` itself: 16 → [1, 2, 4, 8, 16]."""
    buckets = []
    rows = 1
    while rows < max_rows:
        buckets.append(rows)
        rows *= 2
    return [*buckets, max_rows]


@dataclass(slots=True)
class _Graph:
    graph: torch.cuda.CUDAGraph
    latents: torch.Tensor
    timesteps: torch.Tensor
    cross_context: torch.Tensor
    global_context: torch.Tensor
    velocity: torch.Tensor


class GraphedDenoiser:
    """Same call as StableAudioDenoiser; replays a captured graph when one fits the batch."""

    def __init__(self, denoiser: StableAudioDenoiser, num_cross_tokens: int, latent_shape: tuple[int, int]) -> None:
        self.denoiser = denoiser
        self.num_cross_tokens = num_cross_tokens
        self.latent_shape = latent_shape
        self._graphs: dict[int, _Graph] = {}
        self._pool = None

    @property
    def captured_buckets(self) -> list[int]:
        return sorted(self._graphs)

    def capture(self, max_rows: int, num_warmup_runs: int = 2) -> None:
        """Captures every bucket up to `max_rows`, largest first so smaller graphs reuse its pool."""
        started_s = time.monotonic()
        with torch.inference_mode(), torch.cuda.device(self.denoiser.transformer.device):
            for rows in reversed(row_buckets(max_rows)):
                self._capture_bucket(rows, num_warmup_runs)
        torch.cuda.synchronize(self.denoiser.transformer.device)
        logger.info("captured DiT graphs for rows %s in %.1f s", self.captured_buckets, time.monotonic() - started_s)

    def _capture_bucket(self, rows: int, num_warmup_runs: int) -> None:
        config = self.denoiser.transformer.config
        device = self.denoiser.transformer.device
        static = [
            torch.zeros(rows, *self.latent_shape, device=device, dtype=self.denoiser.transformer.dtype),
            torch.zeros(rows, device=device, dtype=torch.float32),
            torch.zeros(rows, self.num_cross_tokens, config.cross_attention_input_dim, device=device),
            torch.zeros(rows, 1, config.global_states_input_dim, device=device),
        ]
        # The warm-up also builds the device rotary tables.
        graph, velocity = capture_graph(lambda: self.denoiser(*static), self._pool, num_warmup_runs)
        self._pool = graph.pool()
        self._graphs[rows] = _Graph(graph, *static, velocity)

    @classmethod
    def captured(cls, denoiser: StableAudioDenoiser, models: StableAudioModels, max_rows: int) -> GraphedDenoiser:
        """`denoiser` with graphs for up to `max_rows` rows of `models`' input shapes, captured now."""
        num_cross_tokens = models.tokenizer.model_max_length + 2  # text tokens, then start and end seconds
        graphed = cls(denoiser, num_cross_tokens, (models.num_latent_channels, models.num_latent_frames))
        graphed.capture(max_rows)
        return graphed

    def release(self) -> None:
        self._graphs.clear()
        self._pool = None

    def __call__(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        cross_context: torch.Tensor,
        global_context: torch.Tensor,
    ) -> torch.Tensor:
        """Shapes as StableAudioDenoiser.__call__; returns a tensor the caller owns (never a graph buffer)."""
        rows = latents.shape[0]
        bucket = next((b for b in self.captured_buckets if b >= rows), None)
        if bucket is None:
            return self.denoiser(latents, timesteps, cross_context, global_context)
        graph = self._graphs[bucket]
        graph.latents[:rows].copy_(latents)
        graph.timesteps[:rows].copy_(timesteps)
        graph.cross_context[:rows].copy_(cross_context)
        graph.global_context[:rows].copy_(global_context)
        graph.graph.replay()
        return graph.velocity[:rows].clone()

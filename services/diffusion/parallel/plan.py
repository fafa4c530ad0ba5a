"""How the ranks of a parallel diffusion group split the work: CFG rows, DiT heads (tp) or tokens (sp).

Pure Python (the config imports it). Rank r of a plan with cfg_degree C and inner degree D (tp or sp) is
CFG group r // D and inner rank r % D; the D ranks of one CFG group shard one DiT forward.
"""

from __future__ import annotations

from dataclasses import dataclass

PARALLEL_MODES = ("none", "cfg", "tp", "sp", "cfg+tp", "cfg+sp")


class ParallelConfigError(ValueError):
    """A parallel mode or degree that the model or the host cannot run; names the config field."""


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    cfg_degree: int
    tp_degree: int
    sp_degree: int

    @property
    def world_size(self) -> int:
        return self.cfg_degree * self.tp_degree * self.sp_degree

    @property
    def inner_degree(self) -> int:
        """Ranks that share one DiT forward (tp or sp; 1 for CFG-parallel alone)."""
        return self.tp_degree * self.sp_degree

    def cfg_rank(self, rank: int) -> int:
        return rank // self.inner_degree

    def inner_rank(self, rank: int) -> int:
        return rank % self.inner_degree

    def inner_group_ranks(self, cfg_rank: int) -> list[int]:
        return list(range(cfg_rank * self.inner_degree, (cfg_rank + 1) * self.inner_degree))


def make_plan(parallel: str, parallel_degree: int, num_heads: int, num_kv_heads: int) -> ParallelPlan:
    """The plan for config `parallel` at `parallel_degree` processes of a DiT with these head counts.

    Raises ParallelConfigError naming the field when the degree does not fit the mode or the heads."""
    if parallel not in PARALLEL_MODES:
        raise ParallelConfigError(f"parallel: expected one of {', '.join(PARALLEL_MODES)}, got {parallel!r}")
    if parallel == "none":
        return ParallelPlan(1, 1, 1)
    if parallel_degree < 2:
        raise ParallelConfigError(f"parallel_degree: {parallel} needs at least 2 processes, got {parallel_degree}")
    cfg_degree = 2 if parallel.startswith("cfg+") else (parallel_degree if parallel == "cfg" else 1)
    if parallel_degree % cfg_degree:
        raise ParallelConfigError(f"parallel_degree: {parallel} needs an even degree, got {parallel_degree}")
    inner_degree = parallel_degree // cfg_degree
    if "+" in parallel and inner_degree < 2:
        raise ParallelConfigError(f"parallel_degree: {parallel} needs at least 4 processes, got {parallel_degree}")
    is_tp = parallel.endswith("tp")
    if parallel != "cfg" and (num_heads % inner_degree or num_kv_heads % inner_degree):
        raise ParallelConfigError(
            f"parallel_degree: the {'tp' if is_tp else 'sp'} degree {inner_degree} must divide the DiT's "
            f"{num_heads} attention heads and {num_kv_heads} KV heads"
        )
    if parallel == "cfg":
        return ParallelPlan(cfg_degree, 1, 1)
    return ParallelPlan(cfg_degree, inner_degree if is_tp else 1, 1 if is_tp else inner_degree)

"""Tensor parallelism for the Stable Audio DiT: heads and feed-forward channels sharded over a group.

Megatron layout: every projection into heads (fused QKV, cross-attention Q and fused KV) and the fused
SwiGLU (hidden | gate) projection are split column-wise, so each rank computes its own heads and its own
channels with no communication; each block's three output projections (self-attention, cross-attention,
feed-forward) are split row-wise and end in one all-reduce. Rank r holds query heads
[r·H/D, (r+1)·H/D) and KV heads [r·K/D, (r+1)·K/D): with the grouped-query mapping (query head h reads KV
head h // (H/K)) those are exactly the KV heads its query heads read, so the cross-attention processor
runs unchanged on the shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class RowParallelLinear(nn.Module):
    """A Linear whose input features are split over `group`: y = all_reduce(x_shard · W_shardᵀ) + b.

    weight: (out_features, in_features / degree) of this rank; bias (out_features,) applied once, after the sum."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.group = group

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states: (..., in_features / degree) → (..., out_features), the same on every rank."""
        output = F.linear(hidden_states, self.weight)
        dist.all_reduce(output, group=self.group)
        return output if self.bias is None else output + self.bias


def _column_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A Linear holding output rows `weight` (already this rank's shard)."""
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta", dtype=weight.dtype)
    linear.weight = nn.Parameter(weight.detach().contiguous(), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().contiguous(), requires_grad=False)
    return linear.eval()


def _rows(tensor: torch.Tensor | None, num_parts: int, rank: int, degree: int) -> torch.Tensor | None:
    """This rank's rows of each of the `num_parts` equal row blocks of `tensor` (fused [q; k; v] etc.)."""
    if tensor is None:
        return None
    parts = tensor.chunk(num_parts, dim=0)
    return torch.cat([part.chunk(degree, dim=0)[rank] for part in parts])


def _row_parallel(linear: nn.Linear, rank: int, degree: int, group: dist.ProcessGroup | None) -> RowParallelLinear:
    return RowParallelLinear(linear.weight.detach().chunk(degree, dim=1)[rank], linear.bias, group)


@torch.no_grad()
def shard_transformer(transformer: nn.Module, rank: int, degree: int, group: dist.ProcessGroup | None) -> None:
    """Shards, in place, every block of a StableAudioDiTModel whose attention chorus.diffusion.attention
    installed (fused to_qkv / to_kv). The separate to_q/to_k/to_v of the checkpoint layout become views of
    the shard where the processors still read them, or are dropped, so a rank keeps 1/degree of the blocks."""
    for block in transformer.transformer_blocks:
        attn1, attn2 = block.attn1, block.attn2
        assert attn1.heads % degree == 0 and attn2.to_kv.out_features % (2 * degree) == 0
        attn1.to_qkv = _column_linear(_rows(attn1.to_qkv.weight, 3, rank, degree), None)
        attn1.heads //= degree
        attn1.to_out[0] = _row_parallel(attn1.to_out[0], rank, degree, group)
        attn2.to_q = _column_linear(_rows(attn2.to_q.weight, 1, rank, degree), None)
        attn2.to_kv = _column_linear(_rows(attn2.to_kv.weight, 2, rank, degree), None)
        attn2.heads //= degree
        attn2.to_out[0] = _row_parallel(attn2.to_out[0], rank, degree, group)
        for attn in (attn1, attn2):
            for name in ("to_k", "to_v") + (("to_q",) if attn is attn1 else ()):
                delattr(attn, name)
        swiglu, down = block.ff.net[0], block.ff.net[2]
        swiglu.proj = _column_linear(
            _rows(swiglu.proj.weight, 2, rank, degree), _rows(swiglu.proj.bias, 2, rank, degree)
        )
        block.ff.net[2] = _row_parallel(down, rank, degree, group)

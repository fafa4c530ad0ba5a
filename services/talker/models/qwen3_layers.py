"""Qwen3 decoder blocks (q/k norm, GQA, SwiGLU) over a caller-owned static KV cache.

The cache layout is `[rows, num_kv_heads, max_positions, head_dim]` per layer. A forward writes the new keys and
values at the given per-row positions and attends to every cached key at a position ≤ the query's position, so a
row's stale entries from an earlier occupant (positions beyond its own) are never seen. All shapes are static for a
given (rows, tokens, attended length), which is what CUDA-graph capture needs.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class Qwen3BlockConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float = 1e-6


class Qwen3RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32, round to the activation dtype, then scale: the reference's bf16 rounding points.
        x_fp32 = x.float()
        x_fp32 = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x_fp32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos/sin `[B, T, head_dim]` for integer `positions [B, T]`, computed in fp32 then cast (NeoX halves)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.float()[..., None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Qwen3Attention(nn.Module):
    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, positions, cache_k, cache_v, attend_mask):
        batch, num_tokens, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, num_tokens, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, num_tokens, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, num_tokens, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        index = positions[:, None, :, None].expand(batch, self.num_kv_heads, num_tokens, self.head_dim)
        cache_k.scatter_(2, index, k)
        cache_v.scatter_(2, index, v)
        attended = attend_mask.shape[-1]
        out = F.scaled_dot_product_attention(
            q, cache_k[:, :, :attended], cache_v[:, :, :attended], attn_mask=attend_mask, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, num_tokens, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, positions, cache_k, cache_v, attend_mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, cache_k, cache_v, attend_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3DecoderStack(nn.Module):
    """`layers` + final `norm`; the stack every Qwen3-TTS transformer (talker, code predictor) is built from."""

    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        cache_k: list[torch.Tensor],
        cache_v: list[torch.Tensor],
        attended_length: int,
    ) -> torch.Tensor:
        """Run the stack on `inputs_embeds [B, T, H]` at `positions [B, T]`; returns post-norm hidden `[B, T, H]`.

        `cache_k[i]`, `cache_v[i]`: `[B, num_kv_heads, max_positions, head_dim]` (views of the caller's cache
        rows). Keys at positions `< attended_length` are attended (causally); it must exceed every position.
        """
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, inputs_embeds.dtype)
        key_positions = torch.arange(attended_length, device=positions.device)
        attend_mask = key_positions[None, None, None, :] <= positions[:, None, :, None]
        x = inputs_embeds
        for layer, layer_k, layer_v in zip(self.layers, cache_k, cache_v, strict=True):
            x = layer(x, cos, sin, positions, layer_k, layer_v, attend_mask)
        return self.norm(x)

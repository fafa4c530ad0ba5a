"""The codec decoder's pre-transformer: 8 causal sliding-window (72 frames) layers with a per-stream KV window.

A new frame attends to itself and the 71 frames before it. Those frames' keys and values (RoPE
applied at their absolute positions) come from the stream state, so a chunk sees exactly what it
would see inside a one-shot decode; RoPE depends only on position differences, and positions
continue across chunks.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from chorus.vocoder.models.codec_config import CodecDecoderConfig


class CodecRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        dtype = hidden.dtype
        hidden = hidden.float()
        hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * hidden.to(dtype)


class CodecLayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), 0.01))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.scale * hidden


class CodecMLP(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(hidden)) * self.up_proj(hidden))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class CodecAttention(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (B, C, hidden), cos/sin (B, 1, C, head_dim), kv (B, 2, kv_heads, W, head_dim), mask (B, 1, C, W+C).

        Returns the attention output (B, C, hidden) and the KV window after this chunk (shape of `kv`).
        """
        batch_size, num_frames, _ = hidden.shape
        query = self.q_proj(hidden).view(batch_size, num_frames, self.num_heads, self.head_dim).transpose(1, 2)
        key = self.k_proj(hidden).view(batch_size, num_frames, self.num_kv_heads, self.head_dim).transpose(1, 2)
        value = self.v_proj(hidden).view(batch_size, num_frames, self.num_kv_heads, self.head_dim).transpose(1, 2)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        keys = torch.cat([kv[:, 0], key], dim=2)
        values = torch.cat([kv[:, 1], value], dim=2)
        window = kv.shape[3]
        next_kv = torch.stack([keys[:, :, -window:], values[:, :, -window:]], dim=1)
        out = F.scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch_size, num_frames, -1)), next_kv


class CodecTransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.self_attn = CodecAttention(config)
        self.mlp = CodecMLP(config)
        self.input_layernorm = CodecRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = CodecRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = CodecLayerScale(config.hidden_size)
        self.mlp_layer_scale = CodecLayerScale(config.hidden_size)

    def forward(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        update, next_kv = self.self_attn(self.input_layernorm(hidden), cos, sin, kv, mask)
        hidden = hidden + self.self_attn_layer_scale(update)
        hidden = hidden + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(hidden)))
        return hidden, next_kv


class CodecTransformer(nn.Module):
    """Linear(latent → hidden) → layers → RMSNorm → Linear(hidden → latent), streamed through a KV window."""

    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.config = config
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.layers = nn.ModuleList([CodecTransformerLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = CodecRMSNorm(config.hidden_size, config.rms_norm_eps)
        exponents = torch.arange(0, config.head_dim, 2, dtype=torch.int64).float() / config.head_dim
        self.register_buffer("inv_freq", 1.0 / (config.rope_theta**exponents), persistent=False)

    def forward(
        self, hidden: torch.Tensor, first_position: torch.Tensor, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (B, C, latent_dim) for C new frames; first_position (B,) int64, the stream position of the
        first new frame; kv (B, num_layers, 2, kv_heads, W, head_dim) with W = sliding_window - 1.

        Returns (B, C, latent_dim) and the next KV window (shape of `kv`).
        """
        num_frames, window = hidden.shape[1], kv.shape[4]
        offsets = torch.arange(-window, num_frames, device=hidden.device)
        key_positions = first_position[:, None] + offsets  # (B, W+C)
        query_positions = key_positions[:, window:]  # (B, C)
        distance = query_positions[:, :, None] - key_positions[:, None, :]
        mask = (distance >= 0) & (distance < self.config.sliding_window) & (key_positions[:, None, :] >= 0)
        freqs = query_positions[:, :, None].float() * self.inv_freq[None, None, :]
        angles = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = angles.cos().to(hidden.dtype), angles.sin().to(hidden.dtype)

        hidden = self.input_proj(hidden)
        next_kv = []
        for index, layer in enumerate(self.layers):
            hidden, layer_kv = layer(hidden, cos, sin, kv[:, index], mask[:, None])
            next_kv.append(layer_kv)
        return self.output_proj(self.norm(hidden)), torch.stack(next_kv, dim=1)

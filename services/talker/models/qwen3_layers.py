"""Qwen3 decoder blocks (q/k norm, GQA, SwiGLU) over a caller-owned static KV cache.

The PyTorch path's cache layout is `[2 (keys, values), rows, num_kv_heads, max_positions, head_dim]` per layer; the
Triton decode path reads a paged one (`decode_kernels`: blocks of positions, a block table per row). A forward
writes the new keys and values at the given per-row positions and attends to every cached key at a position ≤ the
query's position, so a row's stale entries from an earlier occupant (positions beyond its own) are never seen. All
shapes are static for a given (rows, tokens, attended length), which is what CUDA-graph capture needs.
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


def compile_for_decode(fn):
    """`torch.compile` for the decode path's element-wise glue: shapes dynamic, one graph, and on Hopper or later
    Inductor's kernels launched with programmatic dependent launch, as the hand-written kernels are (`pdl`): each
    starts while the kernel before it ends and waits there for its output. A 0.6B step has ~300 such launches; with
    PDL it took 4.32–4.35 ms at batch 64 against 4.69–4.70 (3.23 against 3.42–3.44 at batch 1; H100,
    bench/results/talker-pdl-20261127-183403.tgz). Inductor emits the waits itself and leaves older GPUs as they
    were."""
    return torch.compile(fn, dynamic=True, fullgraph=True, options={"triton.enable_pdl": True})


class Qwen3RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS-normalise the last dim in fp32, round to the activation dtype, then scale: the reference's bf16 rounding
    points. `weight` broadcasts against `x`."""
    x_fp32 = x.float()
    x_fp32 = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x_fp32.to(x.dtype)


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
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps)
        self.qkv_proj: nn.Linear | None = None

    def fuse_projections(self) -> None:
        """Replace q/k/v by one matrix (one kernel instead of three per decode step); serving only — the
        checkpoint's keys name the separate projections."""
        self.qkv_proj = _concatenated(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        """Rotated queries `[B, heads, T, D]` and stacked keys/values `[2, B, kv_heads, T, D]` of `x [B, T, H]`."""
        batch, num_tokens, _ = x.shape
        if self.qkv_proj is None:
            qkv = torch.cat((self.q_proj(x), self.k_proj(x), self.v_proj(x)), dim=-1)
        else:
            qkv = self.qkv_proj(x)
        qkv = qkv.view(batch, num_tokens, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        # Query and key heads are normalised and rotated together (one fused kernel when compiled), each head
        # with its own projection's norm weight.
        num_qk_heads = self.num_heads + self.num_kv_heads
        norm_weight = torch.cat(
            (self.q_norm.weight.expand(self.num_heads, -1), self.k_norm.weight.expand(self.num_kv_heads, -1))
        )
        qk = rms_norm(qkv[:, :, :num_qk_heads], norm_weight, self.q_norm.eps)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta, x.dtype)
        cos, sin = cos[:, :, None], sin[:, :, None]
        qk = (qk * cos + _rotate_half(qk) * sin).transpose(1, 2)
        v = qkv[:, :, num_qk_heads:].transpose(1, 2)
        return qk[:, : self.num_heads], torch.stack((qk[:, self.num_heads :], v))

    def attend(self, q: torch.Tensor, kv: torch.Tensor, attend_mask: torch.Tensor) -> torch.Tensor:
        """Heads' outputs `[B, T, heads · D]` (before `o_proj`) of queries `q [B, heads, T, D]` over cached
        keys/values `kv [2, B, kv_heads, L, D]`.

        Grouped-query attention without repeating the cache: the `heads / kv_heads` query heads that share a
        key head are folded into its query rows, so each key head is read once (what a decode step is bound by).
        """
        batch, _, num_tokens, _ = q.shape
        group = self.num_heads // self.num_kv_heads
        q = q.reshape(batch, self.num_kv_heads, group * num_tokens, self.head_dim)
        scores = torch.matmul(q, kv[0].transpose(-1, -2)).float() * self.head_dim**-0.5
        mask = attend_mask.expand(batch, 1, num_tokens, -1).repeat(1, 1, group, 1)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(kv.dtype)
        out = torch.matmul(weights, kv[1]).view(batch, self.num_heads, num_tokens, self.head_dim)
        return out.transpose(1, 2).reshape(batch, num_tokens, self.num_heads * self.head_dim)


class Qwen3MLP(nn.Module):
    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_proj: nn.Linear | None = None

    def fuse_projections(self) -> None:
        """One matrix for gate and up (serving only, like `Qwen3Attention.fuse_projections`)."""
        self.gate_up_proj = _concatenated(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def _concatenated(*projections: nn.Linear) -> nn.Linear:
    weight = torch.cat([projection.weight for projection in projections])
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    return fused


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.decode_kernels = None  # `chorus.talker.models.decode_kernels` once the stack is optimised on CUDA
        self.decode_output_and_mlp = None  # `output_and_mlp` compiled for those decode steps

    def attention_inputs(self, normed: torch.Tensor, positions: torch.Tensor):
        return self.self_attn.project(normed, positions)

    def output_and_mlp(self, x, attended, next_norm_weight: torch.Tensor):
        """The residual stream after this layer given the heads' outputs `attended [B, T, heads · D]`, and it
        normalised by the next norm (the next layer's input norm, or the stack's final norm): the add and the norm
        fuse into one kernel across the layer boundary."""
        x = x + self.self_attn.o_proj(attended)
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, rms_norm(x, next_norm_weight, self.post_attention_layernorm.eps)

    def attention_and_mlp(self, x, q, kv, attend_mask, next_norm_weight: torch.Tensor):
        return self.output_and_mlp(x, self.self_attn.attend(q, kv, attend_mask), next_norm_weight)

    def forward(self, x, normed, positions, kv_cache, attend_mask, next_norm_weight, block_table=None):
        """`x`: the residual stream `[B, T, H]`; `normed`: it after this layer's input norm. Returns both for the
        next layer (see `output_and_mlp`). `attend_mask` None: a decode step through the Triton kernels, over the
        paged `kv_cache` whose rows' blocks `block_table` lists."""
        if attend_mask is None:
            return self._decode(x, normed, positions, kv_cache, block_table, next_norm_weight)
        # The cache write sits between two cache-free halves: `optimize_for_decode` compiles the halves and the
        # in-place write stays one plain scatter into the caller's cache (no functionalised copy of it).
        q, kv = self.attention_inputs(normed, positions)
        kv_cache.scatter_(3, positions[None, :, None, :, None].expand_as(kv), kv)
        return self.attention_and_mlp(x, q, kv_cache[:, :, :, : attend_mask.shape[-1]], attend_mask, next_norm_weight)

    def _decode(self, x, normed, positions, kv_cache, block_table, next_norm_weight):
        """`forward` for a decode step on CUDA: projection, then the two Triton kernels (norm, rotation and cache
        write; attention over the written positions), then the compiled output half."""
        queries = self._queries(self.self_attn.qkv_proj(normed), positions, kv_cache, block_table)
        attended = self.decode_kernels.decode_attention(queries, kv_cache, block_table, positions)
        return self.decode_output_and_mlp(x, attended, next_norm_weight)

    def decode_few_rows(self, x, positions, kv_cache, block_table):
        """A decode step of at most `few_rows_matmul.MAX_ROWS` rows (batch × tokens) on CUDA: the residual stream
        `x [B, T, H]` after this layer, in six launches. The norms fuse into the projections that read their output,
        the residual adds into those that write the stream, SwiGLU into the gate-up projection."""
        from chorus.talker.models.few_rows_matmul import few_rows_matmul

        batch, num_tokens, hidden_size = x.shape
        attention, mlp, eps = self.self_attn, self.mlp, self.input_layernorm.eps
        rows = x.reshape(batch * num_tokens, hidden_size)
        qkv = few_rows_matmul(rows, attention.qkv_proj.weight, self.input_layernorm.weight, eps)
        queries = self._queries(qkv.view(batch, num_tokens, -1), positions, kv_cache, block_table)
        attended = self.decode_kernels.decode_attention(queries, kv_cache, block_table, positions)
        attended = attended.view(len(rows), -1)
        after_attention = few_rows_matmul(attended, attention.o_proj.weight, residual=rows)
        weight, norm_weight = mlp.gate_up_proj.weight, self.post_attention_layernorm.weight
        activations = few_rows_matmul(after_attention, weight, norm_weight, eps, swiglu=True)
        return few_rows_matmul(activations, mlp.down_proj.weight, residual=after_attention).view_as(x)

    def _queries(self, qkv, positions, kv_cache, block_table):
        """Normalised, rotated queries of `qkv [B, T, (heads + 2 kv_heads) D]`; its keys and values into the cache."""
        attention = self.self_attn
        return self.decode_kernels.qk_norm_rope_store(
            qkv,
            attention.q_norm.weight,
            attention.k_norm.weight,
            positions,
            kv_cache,
            block_table,
            attention.num_heads,
            attention.q_norm.eps,
            attention.rope_theta,
        )


class Qwen3DecoderStack(nn.Module):
    """`layers` + final `norm`; the stack every Qwen3-TTS transformer (talker, code predictor) is built from."""

    def __init__(self, config: Qwen3BlockConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.optimized = False
        self.decode_kernels = None  # set by `optimize_for_decode` where the Triton decode kernels apply
        self.few_rows_matmul = None  # the `few_rows_matmul` module where decode steps of few rows take it

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attended_length: int,
        block_table: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the stack on `inputs_embeds [B, T, H]` at `positions [B, T]`; returns post-norm hidden `[B, T, H]`.

        `kv_caches[i]`: `[2, B, num_kv_heads, max_positions, head_dim]` (a view of the caller's cache rows). Keys at
        positions `< attended_length` are attended (causally); it must exceed every position. Decode steps through
        the Triton kernels (`uses_kernels`) take paged caches instead, `[2, blocks, num_kv_heads, block_size,
        head_dim]` with `block_table [B, blocks per row]`, and attend each row's written positions whatever
        `attended_length` says.
        """
        if self.takes_few_rows(positions):
            return self.norm(self.few_rows_residual(inputs_embeds, positions, kv_caches, block_table))
        attend_mask = None
        if not self.uses_kernels(positions.shape[1]):
            key_positions = torch.arange(attended_length, device=positions.device)
            attend_mask = key_positions[None, None, None, :] <= positions[:, None, :, None]
        x, normed = inputs_embeds, self.layers[0].input_layernorm(inputs_embeds)
        next_norms = [layer.input_layernorm.weight for layer in self.layers[1:]] + [self.norm.weight]
        for layer, kv_cache, next_norm_weight in zip(self.layers, kv_caches, next_norms, strict=True):
            x, normed = layer(x, normed, positions, kv_cache, attend_mask, next_norm_weight, block_table)
        return normed

    def takes_few_rows(self, positions: torch.Tensor) -> bool:
        """Whether a forward at `positions [B, T]` is a decode step through `Qwen3DecoderLayer.decode_few_rows`."""
        few_rows = self.few_rows_matmul is not None and positions.numel() <= self.few_rows_matmul.MAX_ROWS
        return few_rows and self.uses_kernels(positions.shape[1])

    def few_rows_residual(self, inputs_embeds, positions, kv_caches, block_table) -> torch.Tensor:
        """`forward` where `takes_few_rows`, before the final norm: the residual stream `[B, T, H]`, for a caller
        that fuses the norm into what reads it (`few_rows_matmul`'s `norm_weight`)."""
        x = inputs_embeds
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.decode_few_rows(x, positions, kv_cache, block_table)
        return x

    def norm_and_project(self, residual: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """`norm(residual) @ weightᵀ` in one kernel for the few rows `[M, H]` of a `few_rows_residual`."""
        return self.few_rows_matmul.few_rows_matmul(residual, weight, self.norm.weight, self.norm.eps)

    def uses_kernels(self, num_tokens: int) -> bool:
        """Whether a forward of `num_tokens` per row takes the Triton decode path (and so a paged cache)."""
        return self.decode_kernels is not None and num_tokens <= self.decode_kernels.MAX_DECODE_TOKENS

    def optimize_for_decode(self, few_rows_matmul: bool = True) -> None:
        """Fuse projections and `torch.compile` what decode steps run (CUDA serving). Fusing element-wise work
        turns ~70 small kernels per layer into ~10, which is what bounds a decode step at small batch.
        `few_rows_matmul`: decode steps of at most `few_rows_matmul.MAX_ROWS` rows (batch × tokens) take
        `Qwen3DecoderLayer.decode_few_rows`, six Triton kernels a layer, instead of cuBLAS and compiled code.

        The halves of the shared path (prefills, and decode steps where the Triton kernels of `decode_kernels` do
        not apply) are compiled; with the kernels, decode steps take their own path, whose output half is compiled
        on its own. Both replay as CUDA graphs, where kernel count is all that matters: a call into code compiled
        for dynamic shapes costs the host 0.3–0.8 ms, which a replay does not pay (an eager prefill, past the
        runner's padded buckets, pays it, as it would pay ~50 kernel launches per layer uncompiled). Layers share
        one compiled artifact per shape class."""
        if self.optimized:
            return
        self.optimized = True
        self.decode_kernels = _decode_kernels_for(self.layers[0].self_attn, self.norm.weight)
        if few_rows_matmul and self.decode_kernels is not None:
            from chorus.talker.models import few_rows_matmul as few_rows_module

            self.few_rows_matmul = few_rows_module
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()
            if self.decode_kernels is not None:
                layer.decode_kernels = self.decode_kernels
                layer.decode_output_and_mlp = compile_for_decode(layer.output_and_mlp)
            layer.attention_inputs = compile_for_decode(layer.attention_inputs)
            layer.attention_and_mlp = compile_for_decode(layer.attention_and_mlp)
        for norm in (self.layers[0].input_layernorm, self.norm):  # the stack's first and, after few rows, last
            norm.forward = compile_for_decode(norm.forward)


def _decode_kernels_for(attention: Qwen3Attention, weight: torch.Tensor):
    """The Triton decode kernels module when it covers this stack's device, dtype and shapes, else None."""
    if weight.device.type != "cuda":
        return None
    from chorus.talker.models import decode_kernels

    if not decode_kernels.supports(attention.head_dim, attention.num_heads, attention.num_kv_heads, weight.dtype):
        return None
    return decode_kernels

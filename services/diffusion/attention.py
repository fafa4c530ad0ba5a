"""Attention of the Stable Audio DiT with fused projections and a cheaper rotary embedding, stock numbers.

Fused projections: each block's self-attention gets one (3·inner, dim) QKV projection and its
cross-attention one (2·kv_inner, cross_dim) KV projection, concatenated once from the checkpoint's
separate to_q/to_k/to_v weights (which stay, as views of the fused weight, so the stock processors and
the checkpoint naming keep working at no extra memory). One wide GEMM instead of three narrow ones fills
the GPU better and halves the launches of the attention inputs.

Rotary: diffusers' StableAudioAttnProcessor2_0 up-casts all of Q and K to fp32, rotates their first
`rotary_dim` channels, concatenates, and casts back: at 16 rows that is several full fp32 copies of Q and
K per layer. Only the rotated channels need fp32; the others round-trip fp16 → fp32 → fp16 unchanged. So
the self-attention processor rotates just those channels in fp32 with the same formula and leaves the
rest alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention
from torch import nn


def rotate_channels(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of the first cos.shape[-1] channels, halves layout ([x1, x2] → [−x2, x1]).

    states: (..., head_dim) any float dtype; cos, sin: (..., rotary_dim) fp32, broadcasting against the
    states' leading dims (positions along the token dim). Returns states' dtype."""
    rotary_dim = cos.shape[-1]
    rotated = states[..., :rotary_dim].float()
    first, second = rotated.chunk(2, dim=-1)
    rotated = rotated * cos + torch.cat([-second, first], dim=-1) * sin
    return torch.cat([rotated.to(states.dtype), states[..., rotary_dim:]], dim=-1)


class RotarySelfAttnProcessor:
    """Processor for a block's `attn1` (multi-head self-attention, no mask, no residual inside); needs
    the fused `to_qkv` of fuse_projections."""

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """hidden_states: (B, N, dim) → (B, N, dim)."""
        assert encoder_hidden_states is None and attention_mask is None
        batch, num_tokens, _ = hidden_states.shape
        # Token-major (B, N, H, D) until SDPA: the rotated Q and K are written in that layout, SDPA's output
        # follows its query's layout, and so the merge of the heads below is a view, not a transposing copy.
        query, key, value = attn.to_qkv(hidden_states).view(batch, num_tokens, 3, attn.heads, -1).unbind(2)
        if rotary_emb is not None:
            cos, sin = (table[:, None] for table in rotary_emb)  # broadcast over the heads
            query, key = rotate_channels(query, cos, sin), rotate_channels(key, cos, sin)
        attended = F.scaled_dot_product_attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
        attended = attended.transpose(1, 2).reshape(batch, num_tokens, -1)
        return attn.to_out[1](attn.to_out[0](attended))


class FusedCrossAttnProcessor:
    """Processor for a block's `attn2` (grouped-query cross-attention to the text and seconds tokens, no
    mask, no rotary); needs the fused `to_kv` of fuse_projections."""

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """hidden_states: (B, N, dim), encoder_hidden_states: (B, T, cross_dim) → (B, N, dim)."""
        assert encoder_hidden_states is not None and attention_mask is None and rotary_emb is None
        batch, num_tokens, _ = hidden_states.shape
        query = attn.to_q(hidden_states).view(batch, num_tokens, attn.heads, -1).transpose(1, 2)
        head_dim = query.shape[-1]
        num_context_tokens = encoder_hidden_states.shape[1]
        kv = attn.to_kv(encoder_hidden_states).view(batch, num_context_tokens, 2, -1, head_dim).permute(2, 0, 3, 1, 4)
        key, value = kv.unbind(0)
        heads_per_kv_head = attn.heads // key.shape[1]
        if heads_per_kv_head > 1:
            # Query head h reads kv head h // heads_per_kv_head, as the stock processor's repeat_interleave.
            key = key.repeat_interleave(heads_per_kv_head, dim=1)
            value = value.repeat_interleave(heads_per_kv_head, dim=1)
        attended = F.scaled_dot_product_attention(query, key, value)
        attended = attended.transpose(1, 2).reshape(batch, num_tokens, -1)
        return attn.to_out[1](attn.to_out[0](attended))


def _fuse(projections: list[nn.Linear]) -> nn.Linear:
    """One Linear whose output is the concatenation of `projections`' outputs; their weights become views
    of its weight, so both paths read the same memory."""
    assert all(p.bias is None for p in projections)
    weight = torch.cat([p.weight.detach() for p in projections])
    # Built on the meta device: its own initial weight would be thrown away at once.
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
    fused.weight = nn.Parameter(weight, requires_grad=False)
    start = 0
    for projection in projections:
        end = start + projection.out_features
        projection.weight = nn.Parameter(weight[start:end], requires_grad=False)
        start = end
    return fused.eval()


@torch.no_grad()
def install_attention(transformer: torch.nn.Module) -> None:
    """Fuses the projections of every block of a StableAudioDiTModel (once) and puts RotarySelfAttnProcessor
    on its self-attention and FusedCrossAttnProcessor on its cross-attention."""
    self_processor, cross_processor = RotarySelfAttnProcessor(), FusedCrossAttnProcessor()
    for block in transformer.transformer_blocks:
        attn1, attn2 = block.attn1, block.attn2
        # What the processors leave out must be absent from the modules.
        for attn in (attn1, attn2):
            assert not attn.residual_connection and attn.rescale_output_factor == 1.0 and attn.norm_cross is None
            assert attn.norm_q is None and attn.norm_k is None
        assert not attn1.is_cross_attention and attn2.is_cross_attention
        assert attn1.to_k.out_features == attn1.to_q.out_features
        if getattr(attn1, "to_qkv", None) is None:
            attn1.to_qkv = _fuse([attn1.to_q, attn1.to_k, attn1.to_v])
        if getattr(attn2, "to_kv", None) is None:
            attn2.to_kv = _fuse([attn2.to_k, attn2.to_v])
        attn1.set_processor(self_processor)
        attn2.set_processor(cross_processor)

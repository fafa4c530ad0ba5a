"""Self-attention of the Stable Audio DiT with a cheaper rotary embedding, same numbers as the stock one.

diffusers' StableAudioAttnProcessor2_0 up-casts all of Q and K to fp32, rotates their first
`rotary_dim` channels, concatenates, and casts back: at 16 rows that is several full fp32 copies of Q and
K per layer. Only the rotated channels need fp32; the others round-trip fp16 → fp32 → fp16 unchanged. So
this processor rotates just those channels in fp32 with the same formula and leaves the rest alone, which
gives the stock results (bit for bit in fp32) with a fraction of the memory traffic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention


def rotate_channels(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of the first cos.shape[-1] channels, halves layout ([x1, x2] → [−x2, x1]).

    states: (B, H, N, head_dim) any float dtype; cos, sin: (N, rotary_dim) fp32. Returns states' dtype."""
    rotary_dim = cos.shape[-1]
    rotated = states[..., :rotary_dim].float()
    first, second = rotated.chunk(2, dim=-1)
    rotated = rotated * cos + torch.cat([-second, first], dim=-1) * sin
    return torch.cat([rotated.to(states.dtype), states[..., rotary_dim:]], dim=-1)


class RotarySelfAttnProcessor:
    """Processor for a block's `attn1` (multi-head self-attention, no mask, no residual inside)."""

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
        query, key, value = (
            projection(hidden_states).view(batch, num_tokens, attn.heads, -1).transpose(1, 2)
            for projection in (attn.to_q, attn.to_k, attn.to_v)
        )
        if rotary_emb is not None:
            query, key = rotate_channels(query, *rotary_emb), rotate_channels(key, *rotary_emb)
        attended = F.scaled_dot_product_attention(query, key, value)
        attended = attended.transpose(1, 2).reshape(batch, num_tokens, -1)
        return attn.to_out[1](attn.to_out[0](attended))


def install_self_attention(transformer: torch.nn.Module) -> None:
    """Puts RotarySelfAttnProcessor on every block's self-attention of a StableAudioDiTModel."""
    processor = RotarySelfAttnProcessor()
    for block in transformer.transformer_blocks:
        attn = block.attn1
        # What the processor leaves out must be absent from the module.
        assert not attn.is_cross_attention and not attn.residual_connection and attn.rescale_output_factor == 1.0
        assert attn.norm_q is None and attn.norm_k is None and attn.to_k.out_features == attn.to_q.out_features
        attn.set_processor(processor)

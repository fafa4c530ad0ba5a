"""Ulysses sequence parallelism for the Stable Audio DiT: tokens split over a group, heads over it in attention.

Each rank holds a contiguous slice of the (padded) token sequence through the whole block stack; every
token-wise layer (norms, feed-forward, cross-attention: its keys are the replicated text tokens) runs on
the slice alone. Self-attention alone needs every token: one all-to-all turns (its tokens, all heads) of
Q, K and V into (all tokens, its heads), the rank rotates with the true positions of the whole sequence
and attends, and a second all-to-all returns (its tokens, all heads). The sequence (1 + L tokens, odd for
the released model) is padded to a multiple of the degree; padded tokens are dropped before attention,
so no real token ever attends to one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from diffusers.models.attention_processor import Attention

from chorus.diffusion.attention import rotate_channels
from chorus.diffusion.dit import StableAudioDenoiser


def _all_to_all(chunks: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """chunks: (degree, ...), chunk j for rank j → (degree, ...), chunk j from rank j."""
    chunks = chunks.contiguous()
    received = torch.empty_like(chunks)  # after contiguous(): empty_like keeps a permuted input's strides
    dist.all_to_all_single(received, chunks, group=group)
    return received


class UlyssesSelfAttnProcessor:
    """A block's `attn1` over a token slice: all-to-all, rotary, attention over all tokens, all-to-all back."""

    def __init__(self, degree: int, group: dist.ProcessGroup | None) -> None:
        self.degree = degree
        self.group = group

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """hidden_states: (B, n, dim), this rank's n = padded_tokens / degree tokens; rotary_emb: cos, sin
        (num_tokens, rotary_dim) of the unpadded sequence. Returns (B, n, dim)."""
        assert encoder_hidden_states is None and attention_mask is None and rotary_emb is not None
        batch, num_local, _ = hidden_states.shape
        num_tokens, degree = rotary_emb[0].shape[0], self.degree
        heads = attn.heads // degree
        qkv = attn.to_qkv(hidden_states).view(batch, num_local, 3, degree, heads, -1)
        # (degree of head groups, B, n, 3, heads, head_dim) → from each rank its tokens of our head group.
        qkv = _all_to_all(qkv.permute(3, 0, 1, 2, 4, 5), self.group)
        qkv = qkv.permute(1, 0, 2, 3, 4, 5).reshape(batch, degree * num_local, 3, heads, -1)[:, :num_tokens]
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        query, key = rotate_channels(query, *rotary_emb), rotate_channels(key, *rotary_emb)
        attended = F.scaled_dot_product_attention(query, key, value)  # (B, heads, num_tokens, head_dim)
        attended = F.pad(attended, (0, 0, 0, degree * num_local - num_tokens))
        attended = attended.view(batch, heads, degree, num_local, -1).permute(2, 0, 3, 1, 4)
        attended = _all_to_all(attended, self.group)  # (degree of head groups, B, n, heads, head_dim)
        attended = attended.permute(1, 2, 0, 3, 4).reshape(batch, num_local, -1)
        return attn.to_out[1](attn.to_out[0](attended))


class SequenceParallelDenoiser:
    """StableAudioDenoiser's forward with the blocks run on this rank's token slice; same arguments and
    result (on every rank of the group)."""

    def __init__(self, denoiser: StableAudioDenoiser, rank: int, degree: int, group: dist.ProcessGroup | None):
        self.denoiser = denoiser
        self.rank, self.degree, self.group = rank, degree, group
        processor = UlyssesSelfAttnProcessor(degree, group)
        for block in denoiser.transformer.transformer_blocks:
            assert block.attn1.heads % degree == 0
            block.attn1.set_processor(processor)

    @torch.inference_mode()
    def __call__(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        cross_context: torch.Tensor,
        global_context: torch.Tensor,
    ) -> torch.Tensor:
        hidden, cross_states = self.denoiser.embed(latents, timesteps, cross_context, global_context)
        num_tokens = hidden.shape[1]
        num_local = -(-num_tokens // self.degree)
        padded = F.pad(hidden, (0, 0, 0, self.degree * num_local - num_tokens))
        local = padded[:, self.rank * num_local : (self.rank + 1) * num_local].contiguous()
        local = self.denoiser.run_blocks(local, cross_states, self.denoiser.rotary(num_tokens, hidden.device))
        gathered = [torch.empty_like(local) for _ in range(self.degree)]
        dist.all_gather(gathered, local, group=self.group)
        return self.denoiser.project_out(torch.cat(gathered, dim=1)[:, :num_tokens])

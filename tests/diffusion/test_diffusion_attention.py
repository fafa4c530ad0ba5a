"""Our self-attention processor gives the stock StableAudioAttnProcessor2_0's results."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import StableAudioAttnProcessor2_0
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.models.transformers.stable_audio_transformer import StableAudioDiTBlock

from chorus.diffusion.attention import RotarySelfAttnProcessor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_stock_processor(dtype):
    """Released head layout (64-dim heads, 32 rotary channels), a short sequence."""
    torch.manual_seed(0)
    block = StableAudioDiTBlock(dim=128, num_attention_heads=2, num_key_value_attention_heads=1,
                                attention_head_dim=64, cross_attention_dim=64).eval().to(dtype)
    hidden = torch.randn(3, 33, 128, dtype=dtype)
    rotary = get_1d_rotary_pos_embed(32, 33, use_real=True, repeat_interleave_real=False)
    with torch.inference_mode():
        block.attn1.set_processor(StableAudioAttnProcessor2_0())
        stock = block.attn1(hidden, rotary_emb=rotary)
        block.attn1.set_processor(RotarySelfAttnProcessor())
        ours = block.attn1(hidden, rotary_emb=rotary)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, stock, rtol=1e-6, atol=1e-6)
    else:
        assert torch.equal(ours, stock)

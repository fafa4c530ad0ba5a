"""Our attention (fused projections, cheaper rotary) gives the stock StableAudioAttnProcessor2_0's results."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.attention_processor import StableAudioAttnProcessor2_0
from diffusers.models.embeddings import get_1d_rotary_pos_embed
from diffusers.models.transformers.stable_audio_transformer import StableAudioDiTBlock
from torch import nn

from chorus.diffusion.attention import FusedCrossAttnProcessor, RotarySelfAttnProcessor, install_attention


class _Blocks(nn.Module):
    """The part of StableAudioDiTModel that install_attention reads."""

    def __init__(self, *blocks: StableAudioDiTBlock) -> None:
        super().__init__()
        self.transformer_blocks = nn.ModuleList(blocks)


def _block(dtype: torch.dtype) -> StableAudioDiTBlock:
    """Released head layout (64-dim heads, 32 rotary channels, 2 query heads per kv head), small width."""
    torch.manual_seed(0)
    block = StableAudioDiTBlock(
        dim=256, num_attention_heads=4, num_key_value_attention_heads=2, attention_head_dim=64, cross_attention_dim=96
    )
    return block.eval().to(dtype)


def _inputs(dtype: torch.dtype):
    generator = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 33, 256, generator=generator).to(dtype)
    context = torch.randn(3, 7, 96, generator=generator).to(dtype)
    rotary = get_1d_rotary_pos_embed(32, 33, use_real=True, repeat_interleave_real=False)
    return hidden, context, rotary


def _run(block: StableAudioDiTBlock, dtype: torch.dtype) -> torch.Tensor:
    hidden, context, rotary = _inputs(dtype)
    with torch.inference_mode():
        return block(hidden, encoder_hidden_states=context, rotary_embedding=rotary)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_matches_stock_processors(dtype):
    block = _block(dtype)
    stock = _run(block, dtype)
    install_attention(_Blocks(block))
    assert isinstance(block.attn1.processor, RotarySelfAttnProcessor)
    assert isinstance(block.attn2.processor, FusedCrossAttnProcessor)
    ours = _run(block, dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(ours, stock, rtol=1e-5, atol=1e-5)
    else:
        # Same products and sums; only the GEMM blocking of the wider fused projection may round differently.
        torch.testing.assert_close(ours, stock, rtol=2e-2, atol=2e-2)


def test_fusion_shares_weights_with_checkpoint_names():
    """The checkpoint's to_q/to_k/to_v become views of the fused weight: no extra memory, and the stock
    processors (which read them) still give the stock result after fusion."""
    block = _block(torch.float32)
    stock = _run(block, torch.float32)
    separate = {name: p.detach().clone() for name, p in block.named_parameters()}
    install_attention(_Blocks(block))
    fused_qkv, fused_kv = block.attn1.to_qkv.weight, block.attn2.to_kv.weight
    for projection in (block.attn1.to_q, block.attn1.to_k, block.attn1.to_v):
        assert projection.weight.untyped_storage().data_ptr() == fused_qkv.untyped_storage().data_ptr()
    for projection in (block.attn2.to_k, block.attn2.to_v):
        assert projection.weight.untyped_storage().data_ptr() == fused_kv.untyped_storage().data_ptr()
    for name, p in block.named_parameters():
        if name in separate:
            assert torch.equal(p, separate[name]), name
    torch.testing.assert_close(fused_qkv, torch.cat([separate[f"attn1.to_{x}.weight"] for x in "qkv"]), rtol=0, atol=0)

    install_attention(_Blocks(block))
    assert block.attn1.to_qkv.weight is fused_qkv, "a second install must not fuse again"

    block.attn1.set_processor(StableAudioAttnProcessor2_0())
    block.attn2.set_processor(StableAudioAttnProcessor2_0())
    assert torch.equal(_run(block, torch.float32), stock)

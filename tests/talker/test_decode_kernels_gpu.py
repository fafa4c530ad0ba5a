"""The Triton decode kernels compute what the PyTorch decode path computes: rotated queries, keys and values
written at each row's position and nowhere else, attention over the written positions (GPU only)."""

from __future__ import annotations

import pytest
import torch

from chorus.talker.models.qwen3_layers import Qwen3Attention, Qwen3BlockConfig

pytestmark = pytest.mark.gpu

TOLERANCES = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def _attention(config: Qwen3BlockConfig, dtype: torch.dtype) -> Qwen3Attention:
    attention = Qwen3Attention(config)
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            scale = 0.1 if "norm" in name else config.hidden_size**-0.5
            parameter.copy_(torch.randn_like(parameter) * scale + (1.0 if "norm" in name else 0.0))
    attention.fuse_projections()
    return attention.to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 2])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "length"), [(16, 8, 128, 256), (16, 8, 128, 16), (4, 2, 16, 64)]
)
def test_kernels_match_the_torch_decode_path(dtype, num_tokens, num_heads, num_kv_heads, head_dim, length):
    from chorus.talker.models.decode_kernels import decode_attention, qk_norm_rope_store

    torch.manual_seed(0)
    config = Qwen3BlockConfig(64, 128, 1, num_heads, num_kv_heads, head_dim, 1e6)
    attention = _attention(config, dtype)
    batch = 5
    first = torch.randint(0, length - num_tokens + 1, (batch, 1), device="cuda")
    first[0] = 0  # a row at the very start
    first[1] = length - num_tokens  # and one at the very end of its cache
    positions = (first + torch.arange(num_tokens, device="cuda")).contiguous()
    x = torch.randn(batch, num_tokens, config.hidden_size, device="cuda", dtype=dtype)
    cache = torch.randn(2, batch, num_kv_heads, length, head_dim, device="cuda", dtype=dtype)
    expected_cache, kernel_cache = cache.clone(), cache.clone()
    with torch.inference_mode():
        q, kv = attention.project(x, positions)
        expected_cache.scatter_(3, positions[None, :, None, :, None].expand_as(kv), kv)
        mask = torch.arange(length, device="cuda")[None, None, None, :] <= positions[:, None, :, None]
        expected = attention.attend(q, expected_cache, mask)

        queries = qk_norm_rope_store(
            attention.qkv_proj(x),
            attention.q_norm.weight,
            attention.k_norm.weight,
            positions,
            kernel_cache,
            num_heads,
            attention.q_norm.eps,
            attention.rope_theta,
        )
        attended = decode_attention(queries, kernel_cache, positions)
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(queries, q.contiguous(), **tolerance)
    torch.testing.assert_close(kernel_cache, expected_cache, **tolerance)  # written there and nowhere else
    torch.testing.assert_close(attended, expected, **tolerance)


def test_attention_reads_cache_rows_of_a_larger_slot_cache():
    """The runner passes views of its slot cache (`cache[:, :rows]`): strided rows must be honoured."""
    from chorus.talker.models.decode_kernels import decode_attention

    torch.manual_seed(1)
    slots = torch.randn(2, 8, 2, 32, 16, device="cuda")
    view = slots[:, :3]
    queries = torch.randn(3, 4, 1, 16, device="cuda")
    positions = torch.tensor([[5], [31], [0]], device="cuda")
    got = decode_attention(queries, view, positions)
    contiguous = decode_attention(queries, view.contiguous(), positions)
    torch.testing.assert_close(got, contiguous, atol=0, rtol=0)

"""The Triton decode kernels compute what the PyTorch decode path computes: rotated queries, keys and values
written at each row's position of its own blocks and nowhere else, attention over the written positions.

On CUDA they run compiled; without it, in Triton's interpreter on the CPU (skipped where Triton is not installed),
which runs the same kernel code — block-table addressing included — but says nothing of speed."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from chorus.talker.models.qwen3_layers import Qwen3Attention, Qwen3BlockConfig

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    assert os.environ.get("TRITON_INTERPRET") == "1", "set by tests/conftest.py before triton is imported"
    pytest.importorskip("triton", reason="the kernels run in Triton's interpreter on the CPU")

TOLERANCES = {torch.float32: {"atol": 1e-4, "rtol": 1e-4}, torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}
DTYPES = [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32]


def _attention(config: Qwen3BlockConfig, dtype: torch.dtype) -> Qwen3Attention:
    attention = Qwen3Attention(config)
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            scale = 0.1 if "norm" in name else config.hidden_size**-0.5
            parameter.copy_(torch.randn_like(parameter) * scale + (1.0 if "norm" in name else 0.0))
    attention.fuse_projections()
    return attention.to(DEVICE, dtype)


def _paged(cache: torch.Tensor, block_size: int, num_blocks: int, generator: torch.Generator):
    """`cache [2, B, H, L, D]` scattered over a pool of `num_blocks` blocks in random order (block 0 left to
    none): the pool `[2, num_blocks, H, block_size, D]` and the block table `[B, L / block_size]`."""
    _, batch, heads, length, head_dim = cache.shape
    per_row = length // block_size
    order = torch.randperm(num_blocks - 1, generator=generator)[: batch * per_row] + 1
    table = order.view(batch, per_row).to(DEVICE, torch.int32)
    pool = torch.randn(2, num_blocks, heads, block_size, head_dim, generator=generator).to(DEVICE, cache.dtype)
    blocks = cache.view(2, batch, heads, per_row, block_size, head_dim).transpose(2, 3)
    pool[:, table.long()] = blocks
    return pool, table


def _unpaged(pool: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    blocks = pool[:, table.long()]  # [2, B, blocks per row, H, block_size, D]
    two, batch, per_row, heads, block_size, head_dim = blocks.shape
    return blocks.transpose(2, 3).reshape(two, batch, heads, per_row * block_size, head_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 2])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "length", "block_size"),
    [(16, 8, 128, 256, 64), (16, 8, 128, 16, 16), (4, 2, 16, 128, 64), (4, 2, 16, 64, 16)],
)
def test_kernels_match_the_torch_decode_path(dtype, num_tokens, num_heads, num_kv_heads, head_dim, length, block_size):
    from chorus.talker.models.decode_kernels import decode_attention, qk_norm_rope_store

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    config = Qwen3BlockConfig(64, 128, 1, num_heads, num_kv_heads, head_dim, 1e6)
    attention = _attention(config, dtype)
    batch = 5
    first = torch.randint(0, length - num_tokens + 1, (batch, 1), device=DEVICE)
    first[0] = 0  # a row at the very start
    first[1] = length - num_tokens  # and one at the very end of its cache
    positions = (first + torch.arange(num_tokens, device=DEVICE)).contiguous()
    x = torch.randn(batch, num_tokens, config.hidden_size, device=DEVICE, dtype=dtype)
    cache = torch.randn(2, batch, num_kv_heads, length, head_dim, device=DEVICE, dtype=dtype)
    num_blocks = 3 * batch * length // block_size  # more than the rows own: the rest must stay untouched
    pool, table = _paged(cache, block_size, num_blocks, generator)
    expected_cache, untouched = cache.clone(), pool.clone()
    with torch.inference_mode():
        q, kv = attention.project(x, positions)
        expected_cache.scatter_(3, positions[None, :, None, :, None].expand_as(kv), kv)
        mask = torch.arange(length, device=DEVICE)[None, None, None, :] <= positions[:, None, :, None]
        expected = attention.attend(q, expected_cache, mask)

        queries = qk_norm_rope_store(
            attention.qkv_proj(x),
            attention.q_norm.weight,
            attention.k_norm.weight,
            positions,
            pool,
            table,
            num_heads,
            attention.q_norm.eps,
            attention.rope_theta,
        )
        attended = decode_attention(queries, pool, table, positions)
    tolerance = TOLERANCES[dtype]
    torch.testing.assert_close(queries, q.contiguous(), **tolerance)
    torch.testing.assert_close(_unpaged(pool, table), expected_cache, **tolerance)  # written at each row's position
    owned = torch.zeros(num_blocks, dtype=torch.bool, device=DEVICE)
    owned[table.long().flatten()] = True
    torch.testing.assert_close(pool[:, ~owned], untouched[:, ~owned], atol=0, rtol=0)  # and nowhere else
    torch.testing.assert_close(attended, expected, **tolerance)


def test_attention_reads_cache_rows_of_a_larger_slot_cache():
    """The runner passes the first rows of its block table (`table[:rows]`): strided rows must be honoured."""
    from chorus.talker.models.decode_kernels import decode_attention

    torch.manual_seed(1)
    pool = torch.randn(2, 17, 2, 16, 16, device=DEVICE)
    table = torch.randperm(16, device=DEVICE).add(1).view(8, 2).to(torch.int32)
    view = table[:3]
    queries = torch.randn(3, 4, 1, 16, device=DEVICE)
    positions = torch.tensor([[5], [31], [0]], device=DEVICE)
    got = decode_attention(queries, pool, view, positions)
    contiguous = decode_attention(queries, pool, view.contiguous(), positions)
    torch.testing.assert_close(got, contiguous, atol=0, rtol=0)


def _talker_through_kernels(loaded):
    """What `optimize_for_decode` sets up on CUDA for the talker's stack, minus compilation: fused projections and
    the Triton kernels for decode steps, so the runner takes its paged kernel path. (The code predictor stays on
    the PyTorch path: 60 more kernel launches per frame would take minutes in the interpreter.)"""
    from chorus.talker.models import decode_kernels

    stack = loaded.model.talker.model
    stack.decode_kernels = decode_kernels
    for layer in stack.layers:
        layer.self_attn.fuse_projections()
        layer.decode_kernels = decode_kernels
        layer.decode_output_and_mlp = layer.output_and_mlp
    return loaded


@pytest.mark.skipif(DEVICE == "cuda", reason="on CUDA the engine tests run this path compiled")
def test_the_engine_on_the_kernel_path_makes_the_codes_of_the_pytorch_path(tiny_folder):
    """Through the kernels the talker reads and writes its cache by block table, also after preemption has handed
    blocks from stream to stream; the codes match the PyTorch path's (fp32 on the CPU)."""
    from chorus.talker.engine.engine import EngineConfig, TalkerEngine
    from chorus.talker.loader import load_checkpoint
    from chorus.talker.sampling import SamplingParams

    def run(loaded, kv_cache_positions):
        config = EngineConfig(max_streams=3, max_positions=128, max_frames=60, max_buffered_frames=60,
                              use_cuda_graphs=False, kv_cache_positions=kv_cache_positions)  # fmt: skip
        engine = TalkerEngine(loaded, config)
        streams = [
            engine.submit(name, engine.voice_request("custom_voice", text, speaker="ryan"), sampling, ignore_eos=True)
            for name, text, sampling in (
                ("a", "Hello world, this is a test.", SamplingParams(seed=1)),
                ("b", "Another sentence to read.", SamplingParams(do_sample=False, subtalker_do_sample=False)),
                ("c", "Numbers like 12.5 Hz.", SamplingParams(seed=3)),
            )
        ]
        engine.run_until_idle()
        return [stream.collect() for stream in streams], engine.stats.preemptions

    expected, _ = run(load_checkpoint(tiny_folder), 0)
    got, preemptions = run(_talker_through_kernels(load_checkpoint(tiny_folder)), 192)  # 3 blocks for 3 × 2
    assert preemptions >= 1
    for expected_frames, frames in zip(expected, got, strict=True):
        assert len(frames) == 60
        np.testing.assert_array_equal(frames, expected_frames)

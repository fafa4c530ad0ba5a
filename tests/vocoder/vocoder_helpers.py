"""Inputs shared by the vocoder tests."""

from __future__ import annotations

import asyncio

import torch

from chorus.vocoder.loader import TINY_CONFIG


def random_codes(num_frames: int, seed: int, batch_size: int = 1) -> torch.Tensor:
    """(batch_size, num_frames, 16) codes drawn from the whole codebook range."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY_CONFIG.decoder.codebook_size, (batch_size, num_frames, 16), generator=generator)


async def until_no_live_streams(engine, timeout_s: float = 10.0) -> None:
    """Waits for every stream's slot to be freed. A stream closed while a batch decodes it keeps its slot until
    that batch ends, which on a loaded 2-core machine can take far longer than one sleep."""
    for _ in range(int(timeout_s / 0.01)):
        if engine.stats().live_streams == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{engine.stats().live_streams} streams still live after {timeout_s} s")

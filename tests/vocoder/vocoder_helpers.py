"""Inputs shared by the vocoder tests."""

from __future__ import annotations

import torch

from chorus.vocoder.loader import TINY_CONFIG


def random_codes(num_frames: int, seed: int, batch_size: int = 1) -> torch.Tensor:
    """(batch_size, num_frames, 16) codes drawn from the whole codebook range."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY_CONFIG.decoder.codebook_size, (batch_size, num_frames, 16), generator=generator)

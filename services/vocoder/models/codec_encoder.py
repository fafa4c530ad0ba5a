"""The codec encoder (24 kHz mono waveform → 16-codebook codes at 12.5 Hz): transformers' Mimi encoder half."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import MimiConfig, MimiModel


class CodecEncoder(nn.Module):
    """Mimi's SEANet encoder, transformer, downsampling and split RVQ; the decoder half is dropped.

    Checkpoint keys are Mimi's, under `mimi.` here and `encoder.` in the official file.
    """

    def __init__(self, mimi_config: dict[str, Any], num_quantizers: int, samples_per_frame: int, sample_rate_hz: int):
        super().__init__()
        self.sample_rate_hz = sample_rate_hz
        self.mimi = MimiModel(MimiConfig(**mimi_config))
        self.mimi.upsample = None
        self.mimi.decoder_transformer = None
        self.mimi.decoder = None
        self.num_quantizers = num_quantizers
        self.samples_per_frame = samples_per_frame

    @torch.inference_mode()
    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        """waveform (B, num_samples) at the input rate → codes (B, ceil(num_samples / samples_per_frame),
        num_quantizers) int64, frame-major. All rows have the same length (no padding)."""
        codes = self.mimi.encode(waveform[:, None, :], num_quantizers=self.num_quantizers, return_dict=True)
        num_frames = -(-waveform.shape[-1] // self.samples_per_frame)
        return codes.audio_codes[:, :, :num_frames].transpose(1, 2)

"""ECAPA-TDNN speaker encoder of the Qwen3-TTS Base checkpoints, with its log-mel front end.

The encoder turns 24 kHz reference audio into one talker-width vector that takes the speaker slot of the prompt.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from chorus.talker.models.qwen3_tts_config import SpeakerEncoderConfig

N_FFT = 1024
HOP_LENGTH = 256
NUM_MELS = 128
MEL_FMAX_HZ = 12000.0


def _hz_to_slaney_mel(freq_hz: torch.Tensor) -> torch.Tensor:
    linear = freq_hz / (200.0 / 3)
    log_part = 15.0 + torch.log(torch.clamp(freq_hz, min=1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return torch.where(freq_hz >= 1000.0, log_part, linear)


def _slaney_mel_to_hz(mels: torch.Tensor) -> torch.Tensor:
    linear = mels * (200.0 / 3)
    log_part = 1000.0 * torch.exp((math.log(6.4) / 27.0) * (mels - 15.0))
    return torch.where(mels >= 15.0, log_part, linear)


def slaney_mel_filterbank(sample_rate_hz: int, n_fft: int, num_mels: int, fmin_hz: float, fmax_hz: float):
    """Triangular Slaney-scale, Slaney-normalised filters `[num_mels, n_fft // 2 + 1]` (librosa's defaults)."""
    fft_freqs = torch.linspace(0, sample_rate_hz / 2, n_fft // 2 + 1, dtype=torch.float64)
    mel_edges = torch.linspace(
        float(_hz_to_slaney_mel(torch.tensor(fmin_hz, dtype=torch.float64))),
        float(_hz_to_slaney_mel(torch.tensor(fmax_hz, dtype=torch.float64))),
        num_mels + 2,
        dtype=torch.float64,
    )
    edges_hz = _slaney_mel_to_hz(mel_edges)
    widths = edges_hz.diff()
    ramps = edges_hz[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = torch.clamp(torch.minimum(lower, upper), min=0.0)
    weights *= (2.0 / (edges_hz[2:] - edges_hz[:-2]))[:, None]
    return weights.float()


def log_mel_spectrogram(audio: torch.Tensor, sample_rate_hz: int = 24000) -> torch.Tensor:
    """`audio [B, samples]` (24 kHz, in [-1, 1]) → log-mel features `[B, frames, 128]` (hop 256 samples)."""
    filters = slaney_mel_filterbank(sample_rate_hz, N_FFT, NUM_MELS, 0.0, MEL_FMAX_HZ).to(audio.device)
    padding = (N_FFT - HOP_LENGTH) // 2
    padded = F.pad(audio.unsqueeze(1), (padding, padding), mode="reflect").squeeze(1)
    spec = torch.stft(
        padded,
        N_FFT,
        hop_length=HOP_LENGTH,
        win_length=N_FFT,
        window=torch.hann_window(N_FFT, device=audio.device),
        center=False,
        return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(filters @ magnitude, min=1e-5)).transpose(1, 2)


def _same_conv(in_channels: int, out_channels: int, kernel_size: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, padding="same", padding_mode="reflect")


class TimeDelayNetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.conv = _same_conv(in_channels, out_channels, kernel_size, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList(TimeDelayNetBlock(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        outputs = [parts[0]]
        for index, part in enumerate(parts[1:]):
            outputs.append(self.blocks[index](part if index == 0 else part + outputs[-1]))
        return torch.cat(outputs, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _same_conv(channels, se_channels)
        self.conv2 = _same_conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SqueezeExcitationRes2NetBlock(nn.Module):
    def __init__(self, in_channels, out_channels, scale, se_channels, kernel_size, dilation) -> None:
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(in_channels, out_channels, 1, 1)
        self.res2net_block = Res2NetBlock(out_channels, scale, kernel_size, dilation)
        self.tdnn2 = TimeDelayNetBlock(out_channels, out_channels, 1, 1)
        self.se_block = SqueezeExcitationBlock(out_channels, se_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class AttentiveStatisticsPooling(nn.Module):
    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _same_conv(attention_channels, channels)

    def _statistics(self, x: torch.Tensor, weights: torch.Tensor):
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(self.eps))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_steps = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, num_steps), 1.0 / num_steps, dtype=x.dtype, device=x.device)
        mean, std = self._statistics(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._statistics(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class Qwen3TTSSpeakerEncoder(nn.Module):
    """ECAPA-TDNN: log-mel `[B, frames, 128]` → speaker vector `[B, enc_dim]` (enc_dim = talker width)."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        channels, kernels, dilations = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        self.blocks = nn.ModuleList([TimeDelayNetBlock(config.mel_dim, channels[0], kernels[0], dilations[0])])
        for i in range(1, len(channels) - 1):
            self.blocks.append(
                SqueezeExcitationRes2NetBlock(
                    channels[i - 1],
                    channels[i],
                    config.enc_res2net_scale,
                    config.enc_se_channels,
                    kernels[i],
                    dilations[i],
                )
            )
        self.mfa = TimeDelayNetBlock(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatisticsPooling(channels[-1], config.enc_attention_channels)
        self.fc = _same_conv(channels[-1] * 2, config.enc_dim)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        block_outputs = []
        for block in self.blocks:
            x = block(x)
            block_outputs.append(x)
        x = self.mfa(torch.cat(block_outputs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

"""The causal Qwen3-TTS 12 Hz codec decoder: 16 codebooks × 2048 at 12.5 Hz → 24 kHz mono, streamed exactly.

Pipeline (module names follow the official checkpoint keys under `decoder.`):
1. `quantizer`: split RVQ dequantisation (codebook 0, codebooks 1..15, each with its own projection).
2. `pre_conv`: causal conv k3, codebook_dim → latent_dim.
3. `pre_transformer`: sliding-window (72) transformer.
4. `upsample`: two ×2 stages (transposed conv + ConvNeXt block), 12.5 → 50 Hz.
5. `decoder`: causal conv k7, four SnakeBeta upsampling blocks (×8, ×5, ×4, ×3), SnakeBeta, conv k7 → 1 channel.
6. clamp to [-1, 1].
"""

from __future__ import annotations

import torch
from torch import nn

from chorus.vocoder.models.codec_config import CodecDecoderConfig
from chorus.vocoder.models.codec_convs import (
    CodecCausalConv1d,
    CodecDecoderBlock,
    CodecSnakeBeta,
    CodecStreamingModule,
    CodecUpsampleStage,
    run_conv,
    snake_into_conv,
    takes_fused_path,
)
from chorus.vocoder.models.codec_state import CodecDecoderState, ContextSlot, StreamContexts
from chorus.vocoder.models.codec_transformer import CodecTransformer


class CodecCodebook(nn.Module):
    """EMA codebook as trained: vectors are `embedding_sum / cluster_usage`."""

    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(codebook_size))
        self.embedding_sum = nn.Parameter(torch.zeros(codebook_size, dim))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes (B, T) → (B, T, dim)."""
        usage = self.cluster_usage.clamp(min=1e-5)[:, None]
        return nn.functional.embedding(codes, self.embedding_sum) / nn.functional.embedding(codes, usage)


class _CodecVQLayer(nn.Module):
    def __init__(self, codebook_size: int, dim: int):
        super().__init__()
        self._codebook = CodecCodebook(codebook_size, dim)


class _CodecVQ(nn.Module):
    def __init__(self, num_codebooks: int, codebook_size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList([_CodecVQLayer(codebook_size, dim) for _ in range(num_codebooks)])


class CodecResidualQuantizer(nn.Module):
    """Sum of the codebook vectors of each frame, projected by a k1 conv. (B, T, K) → (B, out_dim, T)."""

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int, out_dim: int):
        super().__init__()
        self.vq = _CodecVQ(num_codebooks, codebook_size, dim)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        summed = self.vq.layers[0]._codebook(codes[..., 0])
        for index, layer in enumerate(self.vq.layers[1:], start=1):
            summed = summed + layer._codebook(codes[..., index])
        summed = summed.transpose(1, 2)  # channels-last (B, dim, T), kept so on the fused path
        return run_conv(self.output_proj, summed)


class CodecSplitQuantizer(nn.Module):
    """Semantic codebook 0 (`rvq_first`) plus acoustic codebooks 1.. (`rvq_rest`). (B, T, K) → (B, codebook_dim, T)."""

    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        dim = config.codebook_dim // 2
        self.rvq_first = CodecResidualQuantizer(1, config.codebook_size, dim, config.codebook_dim)
        self.rvq_rest = CodecResidualQuantizer(
            config.num_quantizers - 1, config.codebook_size, dim, config.codebook_dim
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first(codes[..., :1]) + self.rvq_rest(codes[..., 1:])


class CodecDecoder(nn.Module):
    """Codes → waveform, one chunk of frames per call, each batch row a stream with its own state.

    `forward(codes, state)` with a fresh state is the one-shot decode; calling it again with the
    returned state continues the stream: any split into chunks gives the same samples.

    On the fused (CUDA) path the activations stay channels-last from the quantizer to the last conv: the
    quantizer's and pre-transformer's (B, T, C) outputs transpose to channels-last (B, C, T) for free, the pre-conv's
    output back to the transformer's (B, T, C) too, and every conv and kernel after keeps the layout.
    """

    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.config = config
        self.quantizer = CodecSplitQuantizer(config)
        self.pre_conv = CodecCausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = CodecTransformer(config)
        self.upsample = nn.ModuleList(CodecUpsampleStage(config.latent_dim, f) for f in config.upsampling_ratios)
        output_dim = config.decoder_dim // 2 ** len(config.upsample_rates)
        self.decoder = nn.ModuleList(
            [CodecCausalConv1d(config.latent_dim, config.decoder_dim, kernel_size=7)]
            + [CodecDecoderBlock(config.decoder_dim // 2**i, rate) for i, rate in enumerate(config.upsample_rates)]
            + [CodecSnakeBeta(output_dim), CodecCausalConv1d(output_dim, 1, kernel_size=7)]
        )
        self.context_size = 0
        for module in self.modules():
            if isinstance(module, CodecStreamingModule) and module.context_samples:
                module.context_slot = ContextSlot(self.context_size, module.context_channels, module.context_samples)
                self.context_size += module.context_slot.size

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    def new_state(self, batch_size: int, device: torch.device | str | None = None) -> CodecDecoderState:
        """Fresh state for `batch_size` streams, on the device and in the dtype of the weights unless told."""
        weight = self.pre_conv.conv.weight
        device = weight.device if device is None else device
        config = self.config
        kv_shape = (
            batch_size,
            config.num_hidden_layers,
            2,
            config.num_key_value_heads,
            config.num_context_frames,
            config.head_dim,
        )
        return CodecDecoderState(
            num_frames=torch.zeros(batch_size, dtype=torch.int64, device=device),
            kv=torch.zeros(kv_shape, dtype=weight.dtype, device=device),
            conv_contexts=torch.zeros(batch_size, self.context_size, dtype=weight.dtype, device=device),
        )

    def forward(self, codes: torch.Tensor, state: CodecDecoderState) -> tuple[torch.Tensor, CodecDecoderState]:
        """Decodes the next frames of B streams.

        Args:
            codes: (B, num_frames, num_quantizers) int64 codes in [0, codebook_size), frame-major.
            state: the streams' state before these frames (not modified).

        Returns:
            waveform (B, num_frames · samples_per_frame) in [-1, 1] at `output_sample_rate_hz`, and the
            state after these frames.
        """
        assert codes.shape[-1] == self.config.num_quantizers, codes.shape
        contexts = StreamContexts(state.conv_contexts)
        hidden = self.pre_conv(self.quantizer(codes), contexts)
        hidden, kv = self.pre_transformer(hidden.transpose(1, 2), state.num_frames, state.kv)
        hidden = hidden.transpose(1, 2)
        for stage in self.upsample:
            hidden = stage(hidden, contexts)
        *blocks, final_act, final_conv = self.decoder
        for module in blocks:
            hidden = module(hidden, contexts)
        if takes_fused_path(hidden):  # the last conv keeps its bias: one output channel, a small pass
            hidden = snake_into_conv(final_act, final_conv, hidden, contexts, conv_bias=True)
        else:
            hidden = final_conv(final_act(hidden), contexts)
        waveform = hidden.squeeze(1).clamp(min=-1.0, max=1.0)
        next_state = CodecDecoderState(state.num_frames + codes.shape[1], kv, contexts.new)
        return waveform, next_state

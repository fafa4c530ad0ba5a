"""Per-stream state of the causal codec decoder, batched: row b of every tensor is one stream.

Everything a chunk decode needs from the past lives here, so decoding a stream chunk by chunk
equals decoding all its frames at once: the attention keys/values of the frames a new frame can
still see (the sliding window) and the left context of every causal conv and transposed conv.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True, slots=True)
class ContextSlot:
    """Where one causal conv keeps its left context inside the flat `conv_contexts` row."""

    offset: int
    num_channels: int
    num_samples: int

    @property
    def size(self) -> int:
        return self.num_channels * self.num_samples


@dataclasses.dataclass(slots=True)
class CodecDecoderState:
    """Decoder state of B streams.

    Attributes:
        num_frames: (B,) int64, frames already decoded per stream (the RoPE position of the next frame).
        kv: (B, num_layers, 2, num_kv_heads, num_context_frames, head_dim), keys (index 0) and values (1)
            of each stream's last frames, RoPE applied; rows of frames before the stream start are masked.
        conv_contexts: (B, N) every causal conv's left context, laid out by `ContextSlot`s.
    """

    num_frames: torch.Tensor
    kv: torch.Tensor
    conv_contexts: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.num_frames.shape[0]

    def bytes_per_stream(self) -> int:
        rows = (self.num_frames, self.kv, self.conv_contexts)
        return sum(t[0].numel() * t.element_size() for t in rows)

    def select(self, rows: torch.Tensor) -> CodecDecoderState:
        """A new state holding copies of `rows` (int64 indices)."""
        return CodecDecoderState(
            self.num_frames.index_select(0, rows),
            self.kv.index_select(0, rows),
            self.conv_contexts.index_select(0, rows),
        )

    def assign(self, rows: torch.Tensor, other: CodecDecoderState) -> None:
        """Writes `other`'s streams into `rows` of this state, in place."""
        self.num_frames.index_copy_(0, rows, other.num_frames)
        self.kv.index_copy_(0, rows, other.kv)
        self.conv_contexts.index_copy_(0, rows, other.conv_contexts)

    def reset(self, rows: torch.Tensor) -> None:
        """Makes `rows` fresh streams: zero context equals the zero padding of a one-shot decode."""
        self.num_frames.index_fill_(0, rows, 0)
        self.kv.index_fill_(0, rows, 0.0)
        self.conv_contexts.index_fill_(0, rows, 0.0)


class StreamContexts:
    """The conv contexts read by one chunk decode (`old`) and the ones it leaves behind (`new`)."""

    def __init__(self, old: torch.Tensor) -> None:
        self.old = old
        self.new = torch.empty_like(old, memory_format=torch.contiguous_format)

    def read(self, slot: ContextSlot) -> torch.Tensor:
        """(B, num_channels, num_samples) left context before this chunk."""
        flat = self.old[:, slot.offset : slot.offset + slot.size]
        return flat.view(-1, slot.num_channels, slot.num_samples)

    def write(self, slot: ContextSlot, context: torch.Tensor) -> None:
        """Keeps a (B, num_channels, num_samples) context of any strides (one copy) for the next chunk."""
        flat = self.new[:, slot.offset : slot.offset + slot.size]
        flat.view(-1, slot.num_channels, slot.num_samples).copy_(context)

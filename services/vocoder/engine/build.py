"""Builds the running engine from the service config: load the codec, size the state pool, capture graphs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from chorus.runtime.buckets import power_of_two_and_midpoint_sizes
from chorus.vocoder.config import VocoderConfig
from chorus.vocoder.engine.engine import BatchReport, DecodeEngine, EngineSettings
from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.loader import load_codec

CUDNN_ALGORITHMS_TRIED = 3  # per convolution shape, when cuDNN autotunes (see build_engine)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    """`auto` is float32: the decoder's SnakeBeta stack is where bf16 audibly loses precision."""
    if name == "auto":
        return torch.float32
    if name not in _DTYPES:
        raise ValueError(f"dtype: expected one of auto, {', '.join(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def build_engine(
    config: VocoderConfig,
    settings: EngineSettings | None = None,
    *,
    graph_chunk_frames: tuple[int, ...] = (1, 2, 4, 8, 16, 25),
    use_cuda_graphs: bool = True,
    on_batch: Callable[[BatchReport], None] | None = None,
    stream_priority: int | None = None,
) -> DecodeEngine:
    """A not-yet-started engine for `config` (call `await engine.start()`). On CUDA, graphs are captured for
    every (batch bucket, chunk length) in `power_of_two_and_midpoint_sizes(settings.max_batch_size)` ×
    `graph_chunk_frames`; the engine cuts every chunk into those lengths (12 frames decode as 8 + 4), so no decode
    runs eager, and fills whole batch sizes where it can (a batch's idle rows cost as much GPU time as its streams'
    rows: with powers of two alone they were a fifth of the vocoder's rows at 64 streams)."""
    settings = settings or EngineSettings()
    device = resolve_device(config.device)
    codec = load_codec(config.model, load_format=config.load_format, device=device, dtype=resolve_dtype(config.dtype))
    is_graphed = use_cuda_graphs and device.type == "cuda"
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # few distinct conv shapes (graph buckets): autotune each once
        # The algorithm cuDNN ranks first runs the decoder's convolutions 35x slower than the tuned one (1.1 s for
        # 64 streams x 25 frames in bf16 on an H200, 32 ms tuned), and trying all 10 of its default limit is most of
        # the graph capture time. The best of the first 3 decoded within 1 % of the best of 10 at 14 of 15 bf16 shapes
        # timed (6 % slower at 4 streams x 25 frames), within 9 % in float32, and captures in a fifth to three
        # quarters of the time (4.4 s against 17.8 s for that bf16 graph; bench/cudnn_limit_probe.py).
        torch.backends.cudnn.benchmark_limit = CUDNN_ALGORITHMS_TRIED
        # float32 means float32: with channels-last activations cuDNN picks TF32 kernels for some batch sizes and
        # not others (~1e-3 apart on an H200), so a stream's samples would depend on the batch it was decoded in.
        if codec.decoder.pre_conv.conv.weight.dtype == torch.float32:
            torch.backends.cudnn.allow_tf32 = False
    if is_graphed:
        batch_sizes = power_of_two_and_midpoint_sizes(settings.max_batch_size)
        settings = dataclasses.replace(settings, piece_lengths=graph_chunk_frames, batch_sizes=batch_sizes)
    runner = CodecRunner(
        codec.decoder,
        config.max_streams,
        graph_batch_sizes=settings.batch_sizes,
        graph_chunk_frames=graph_chunk_frames if is_graphed else (),
    )
    return DecodeEngine(runner, settings, encoder=codec.encoder, on_batch=on_batch, stream_priority=stream_priority)

"""The only code that runs the codec decoder: a pool of per-stream states and batched chunk decodes, replayed
from CUDA graphs per (batch bucket, chunk length) where captured, eager otherwise."""

from __future__ import annotations

import bisect
import logging
import time

import torch

from chorus.runtime.streams import capture_graph
from chorus.vocoder.models.codec_convs import channels_last_conv_weights_
from chorus.vocoder.models.codec_decoder import CodecDecoder

_log = logging.getLogger(__name__)


class CodecRunner:
    """Decodes chunks of many streams in one forward. Rows of the state pool are streams' slots; one extra
    row is scratch, written by the padding rows of graph buckets. Call from a single thread."""

    def __init__(
        self,
        decoder: CodecDecoder,
        max_streams: int,
        *,
        graph_batch_sizes: tuple[int, ...] = (),
        graph_chunk_frames: tuple[int, ...] = (),
    ) -> None:
        self.decoder = decoder
        self.device = decoder.pre_conv.conv.weight.device
        if self.device.type == "cuda":  # the fused path's activations are channels-last: its weights too, once
            channels_last_conv_weights_(decoder)
        self.max_streams = max_streams
        self.scratch_slot = max_streams
        self.pool = decoder.new_state(max_streams + 1)
        self.bytes_per_stream = self.pool.bytes_per_stream()
        self._graph_batch_sizes = sorted(graph_batch_sizes)
        self._graphs: dict[tuple[int, int], _CapturedDecode] = {}
        if self.device.type == "cuda" and graph_batch_sizes and graph_chunk_frames:
            started = time.perf_counter()
            memory_pool = torch.cuda.graph_pool_handle()  # one pool for all graphs; outputs are copied out at once
            for num_frames in sorted(graph_chunk_frames, reverse=True):
                for batch_size in sorted(graph_batch_sizes, reverse=True):
                    key = (batch_size, num_frames)
                    self._graphs[key] = _CapturedDecode(self, batch_size, num_frames, memory_pool)
            _log.info(
                "vocoder: %d decode graphs (batch sizes %s × chunk frames %s) in %.1f s",
                len(self._graphs),
                ",".join(map(str, self._graph_batch_sizes)),
                ",".join(map(str, sorted(graph_chunk_frames))),
                time.perf_counter() - started,
            )

    def close(self) -> None:
        """Releases the graphs and their memory pool."""
        self._graphs.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def captured_shapes(self) -> list[tuple[int, int]]:
        return sorted(self._graphs)

    @torch.inference_mode()
    def decode(self, slots: list[int], codes: torch.Tensor, new_streams: list[int] = ()) -> torch.Tensor:
        """Decodes one chunk per stream: codes (B, num_frames, num_quantizers) for the streams in `slots`.
        Slots in `new_streams` are reset first. Returns the waveform (B, num_frames · samples_per_frame) on the CPU."""
        if new_streams:
            self.pool.reset(torch.tensor(new_streams, device=self.device))
        batch_size, num_frames = codes.shape[:2]
        bucket = bisect.bisect_left(self._graph_batch_sizes, batch_size)
        if bucket < len(self._graph_batch_sizes):
            graph = self._graphs.get((self._graph_batch_sizes[bucket], num_frames))
            if graph is not None:
                return graph.replay(slots, codes)
        return self.decode_eager(slots, codes).cpu()

    def decode_eager(self, slots: list[int] | torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        rows = torch.as_tensor(slots, dtype=torch.int64, device=self.device)
        waveform, state = self.decoder(codes.to(self.device), self.pool.select(rows))
        self.pool.assign(rows, state)
        return waveform.float()


class _CapturedDecode:
    """One CUDA graph: gather the rows' state, decode, scatter the state back, for a fixed (batch, frames)."""

    def __init__(self, runner: CodecRunner, batch_size: int, num_frames: int, memory_pool) -> None:
        self.runner = runner
        num_quantizers = runner.decoder.config.num_quantizers
        self.codes = torch.zeros(batch_size, num_frames, num_quantizers, dtype=torch.int64, device=runner.device)
        self.slots = torch.full((batch_size,), runner.scratch_slot, dtype=torch.int64, device=runner.device)
        with torch.inference_mode():  # warm-up runs on the scratch row only: live rows must not change
            self.graph, self.waveform = capture_graph(lambda: runner.decode_eager(self.slots, self.codes), memory_pool)

    def replay(self, slots: list[int], codes: torch.Tensor) -> torch.Tensor:
        batch_size = codes.shape[0]
        self.codes.zero_()
        self.codes[:batch_size].copy_(codes, non_blocking=True)
        self.slots.fill_(self.runner.scratch_slot)
        self.slots[:batch_size].copy_(torch.as_tensor(slots, dtype=torch.int64), non_blocking=True)
        self.graph.replay()
        return self.waveform[:batch_size].cpu()

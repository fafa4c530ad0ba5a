"""CUDA graphs of the talker decode step (15 code-predictor steps + sampling, then the talker token), two per
(batch bucket, attended-length bucket, sampler: sorting or selecting) — the frame's half and the talker's half, so
the frames can go to the host between them — captured on first use and replayed after.

The step reads and writes only the runner's static buffers, so a replay needs no argument passing. Warm-up and
capture run with every row inactive: inactive rows keep their state, and the cache entries they write sit at
positions that a later real step overwrites before anything attends to them. All graphs share one memory pool;
they never run concurrently.
"""

from __future__ import annotations

import torch

from chorus.runtime.streams import capture_graph


class DecodeGraphs:
    def __init__(self, runner) -> None:
        self.runner = runner
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, torch.cuda.CUDAGraph]] = {}
        self.pool = None

    @torch.no_grad()
    def capture(self, num_rows: int, attended_length: int, top_k_bound: int) -> None:
        runner = self.runner
        saved_active = runner.active.clone()
        runner.active.zero_()
        predict = self._capture(lambda: runner.predict_compute(num_rows, top_k_bound))
        advance = self._capture(lambda: runner.advance_compute(num_rows, attended_length, top_k_bound))
        runner.active.copy_(saved_active)
        self.graphs[(num_rows, attended_length, top_k_bound)] = (predict, advance)

    def _capture(self, run) -> torch.cuda.CUDAGraph:
        graph, _ = capture_graph(run, self.pool)
        if self.pool is None:
            self.pool = graph.pool()
        return graph

    def halves(self, num_rows: int, attended_length: int, top_k_bound: int):
        """The replays of the step's two halves (`predict_compute`, `advance_compute`), in that order."""
        key = (num_rows, attended_length, top_k_bound)
        if key not in self.graphs:
            self.capture(*key)
        predict, advance = self.graphs[key]
        return predict.replay, advance.replay

    def release(self) -> None:
        self.graphs.clear()
        self.pool = None

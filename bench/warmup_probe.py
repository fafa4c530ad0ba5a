"""`python bench/warmup_probe.py [TOP]` on a GPU: where the talker's warm-up spends its time. It builds the talker
as `chorus serve speech` does (TalkerConfig from the CHORUS_TALKER_* environment, the speech process's stream
priority), times the warm-up, and samples the warm-up thread's stack every 10 ms: one JSON line with the total
seconds and the TOP (default 40) functions found on the most samples, each with its share of the warm-up (inclusive:
a function counts while anything it called runs). Run it twice on one machine to see what the compile caches
(Inductor's and Triton's, on local disk) save a second start; with `TORCH_LOGS=recompiles` on, which guard made
each compiled function compile again."""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from pathlib import Path

from torch._dynamo.utils import counters

from chorus.runtime.config import load_config
from chorus.speech import TALKER_STREAM_PRIORITY
from chorus.talker.config import TalkerConfig
from chorus.talker.service import TalkerService

SAMPLE_S = 0.01


class StackSampler:
    """Counts, per function, the samples of `thread_id`'s stack it appears on (once a sample)."""

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            frame = sys._current_frames().get(self.thread_id)
            names = set()
            while frame is not None:
                code = frame.f_code
                names.add(f"{Path(code.co_filename).name}:{code.co_name}")
                frame = frame.f_back
            self.counts.update(names)
            self.samples += 1


def main() -> None:
    top = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    service = TalkerService(load_config(TalkerConfig), stream_priority=TALKER_STREAM_PRIORITY)
    started = time.perf_counter()
    with StackSampler(threading.get_ident()) as sampler:
        engine = service._build_engine()  # loading, then the warm-up the service logs
    total_s = time.perf_counter() - started
    shares = {name: round(count / max(sampler.samples, 1), 3) for name, count in sampler.counts.most_common(top)}
    graphs = engine.runner.graphs
    dynamo = {f"dynamo_{group}": dict(counters[group]) for group in ("frames", "stats")}
    head = {"build_s": round(total_s, 1), "decode_graphs": len(graphs.graphs) if graphs else 0}
    print(json.dumps(head | dynamo | shares))
    engine.stop()


if __name__ == "__main__":
    main()

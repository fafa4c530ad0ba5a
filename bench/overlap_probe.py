"""`python bench/overlap_probe.py` on a GPU: how much talker and vocoder work overlap when they share the GPU.

An experiment kept for its answer, not a serving path. The speech process (`chorus serve speech`) runs the
talker's decode steps and the vocoder's chunk batches on two threads, each on a CUDA stream of its own. This
probe runs the same two loops — the talker engine stepping a full batch (released 0.6B shapes, dummy weights,
bf16, compiled step, graphs), the vocoder runner replaying one (streams × frames) graph — alone and together, for
a fixed time each, and reports per mode the talker's ms a step and the vocoder's ms a batch. Modes:

- `alone`: each loop by itself (`alone-eager`: the vocoder's decode without its graph);
- `streams`: both, on plain streams, the vocoder's at the higher priority (as served); `streams-talker-first`;
- `green-<n>`: both, the vocoder on a stream of a green context of n SMs (`torch.cuda.green_contexts`), with its
  graphs captured on that stream, the talker on the whole GPU; `green-<n>-vocoder-alone`, and the vocoder alone on
  that stream replaying graphs captured in the primary context (`-primary-graphs`) or eager (`-eager-alone`), tell
  whether the partition applies at all. A mode that fails reports its error (H100, PyTorch 2.11: graph replays
  ignore the partition, and cuDNN cannot capture on a green context's stream).

For each mode it also gives the pipeline's capacity in audio-s/s: the work mix (every talker frame needs its
vocoder decode) scheduled as well as the two measured rates allow — both loops together while both have work, the
faster one's surplus time spent on the other alone. Writes `overlap-<stamp>.json` to `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from chorus.bench.report import commit
from chorus.runtime import streams as streams_module
from chorus.talker.bench import _voice
from chorus.talker.engine.engine import FRAME_RATE_HZ, GIL_SWITCH_INTERVAL_S, EngineConfig, TalkerEngine
from chorus.talker.loader import build_talker
from chorus.talker.sampling import SamplingParams
from chorus.vocoder.engine.runner import CodecRunner
from chorus.vocoder.loader import load_codec


class TalkerLoop:
    def __init__(self, batch_size: int, max_steps: int) -> None:
        with tempfile.TemporaryDirectory() as workdir:
            loaded = build_talker("0.6b", "dummy", torch.device("cuda"), torch.bfloat16, Path(workdir))
        self.batch_size, self.frames = batch_size, max_steps + 8
        config = EngineConfig(
            max_streams=batch_size,
            max_positions=self.frames + 160,
            max_frames=self.frames,
            max_buffered_frames=self.frames,
            max_prefills_per_step=batch_size,
            compile_step=True,
        )
        self.engine = TalkerEngine(loaded, config)
        self.voice = _voice(self.engine, voice_clone=False)
        self.round = 0

    def prepare(self) -> None:
        """A fresh full batch, prefilled and decoding."""
        self.round += 1
        self.ids = [f"r{self.round}-{i}" for i in range(self.batch_size)]
        for index, request_id in enumerate(self.ids):
            self.engine.submit(request_id, self.voice, SamplingParams(seed=index), max_frames=self.frames,
                               ignore_eos=True)  # fmt: skip
        for _ in range(4):
            self.engine.step()
        torch.cuda.synchronize()

    def finish(self) -> None:
        for request_id in self.ids:
            self.engine.abort(request_id)
        self.engine.run_until_idle()

    def iterate(self) -> None:
        self.engine.step()

    def audio_s(self, iterations: int) -> float:
        return iterations * self.batch_size / FRAME_RATE_HZ


class VocoderLoop:
    def __init__(self, num_streams: int, chunk_frames: int) -> None:
        torch.backends.cudnn.benchmark = True
        decoder = load_codec("released", load_format="dummy", device=torch.device("cuda"), dtype=torch.bfloat16).decoder
        self.runner = CodecRunner(decoder, max_streams=num_streams, graph_batch_sizes=(num_streams,),
                                  graph_chunk_frames=(chunk_frames,))  # fmt: skip
        self.slots = list(range(num_streams))
        self.codes = torch.randint(0, 2048, (num_streams, chunk_frames, 16))
        self.runner.decode(self.slots, self.codes, new_streams=self.slots)
        self.num_streams, self.chunk_frames = num_streams, chunk_frames

    def prepare(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def iterate(self) -> None:
        self.runner.decode(self.slots, self.codes)  # replays the graph, waits for its audio on the host

    def audio_s(self, iterations: int) -> float:
        return iterations * self.num_streams * self.chunk_frames / FRAME_RATE_HZ


class EagerVocoderLoop(VocoderLoop):
    """The same decode without its graph (kernels launched one by one on the current stream)."""

    def __init__(self, graphed: VocoderLoop) -> None:
        self.__dict__.update(graphed.__dict__)

    def iterate(self) -> None:
        self.runner.decode_eager(self.slots, self.codes).cpu()


def run_together(loops: dict, streams: dict, seconds: float) -> dict:
    """Runs each loop on its own thread and stream for `seconds`; ms per iteration and audio-s/s of each."""
    for loop in loops.values():
        loop.prepare()
    stop, counts, spans = threading.Event(), {}, {}

    def worker(name):
        loop, stream = loops[name], streams[name]
        with stream() if callable(stream) else torch.cuda.stream(stream):
            started, count = time.perf_counter(), 0
            while not stop.is_set():
                loop.iterate()
                count += 1
            torch.cuda.current_stream().synchronize()
            counts[name], spans[name] = count, time.perf_counter() - started

    threads = [threading.Thread(target=worker, args=(name,)) for name in loops]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    for loop in loops.values():
        loop.finish()
    return {
        name: {
            "ms_per_iteration": round(spans[name] / max(1, counts[name]) * 1e3, 3),
            "audio_s_per_s": round(loops[name].audio_s(counts[name]) / spans[name], 1),
        }
        for name in loops
    }


def _captured_on(stream: torch.cuda.Stream, build):
    """`build()` with this thread's graph captures (`chorus.runtime.streams.capture_stream`) on `stream`."""
    captures = streams_module._per_thread.__dict__
    captures["capture_streams"] = {torch.cuda.current_device(): stream}
    try:
        return build()
    finally:
        del captures["capture_streams"]


def capacity(talker_alone: float, vocoder_alone: float, talker_both: float, vocoder_both: float) -> float:
    """Audio-s/s of the pipeline from the rates alone and together: both run together while both have work, and
    the one with surplus leaves time to the other running alone (fractions a together, 1 − a alone)."""
    if talker_both <= vocoder_both:  # the vocoder keeps up while together; the talker alone for the rest
        together = talker_alone / (vocoder_both - talker_both + talker_alone)
        return together * vocoder_both
    together = vocoder_alone / (talker_both - vocoder_both + vocoder_alone)
    return together * talker_both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--talker-batch", type=int, default=64)
    parser.add_argument("--vocoder-streams", type=int, default=16)
    parser.add_argument("--chunk-frames", type=int, default=25)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--green-sms", default="16,32,48,64", help="vocoder SM shares to try")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args()
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))  # as the serving engine thread does
    talker = TalkerLoop(args.talker_batch, max_steps=int(args.seconds / 0.003) + 50)
    vocoder = VocoderLoop(args.vocoder_streams, args.chunk_frames)
    high, low = torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)
    modes = {}

    def attempt(label, run):
        """One mode; a mode that fails (green contexts are a beta API) is reported, not fatal."""
        try:
            modes[label] = run()
        except Exception as exc:
            modes[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(label, json.dumps(modes[label]), flush=True)

    modes["alone"] = run_together({"talker": talker}, {"talker": low}, args.seconds) | run_together(
        {"vocoder": vocoder}, {"vocoder": high}, args.seconds
    )
    print("alone", json.dumps(modes["alone"]), flush=True)
    attempt("alone-eager", lambda: run_together({"vocoder": EagerVocoderLoop(vocoder)}, {"vocoder": high}, 1.0))
    attempt("streams", lambda: run_together({"talker": talker, "vocoder": vocoder}, {"talker": low, "vocoder": high},
                                            args.seconds))  # fmt: skip
    attempt("streams-talker-first", lambda: run_together(
        {"talker": talker, "vocoder": vocoder}, {"talker": high, "vocoder": low}, args.seconds
    ))  # fmt: skip
    from torch.cuda.green_contexts import GreenContext

    device, contexts = torch.cuda.current_device(), []
    for num_sms in [int(v) for v in args.green_sms.split(",") if v]:
        contexts.append(GreenContext.create(num_sms=num_sms, device_id=device))  # alive while its stream is used
        green = contexts[-1].Stream()
        attempt(f"green-{num_sms}-vocoder-alone-primary-graphs",
                lambda: run_together({"vocoder": vocoder}, {"vocoder": green}, args.seconds))  # noqa: B023  # fmt: skip
        attempt(f"green-{num_sms}-vocoder-eager-alone",
                lambda: run_together({"vocoder": EagerVocoderLoop(vocoder)}, {"vocoder": green}, 1.0))  # noqa: B023  # fmt: skip
        # Kernels keep the context they were captured in: the vocoder's graphs are captured on the green stream.
        try:
            captured = _captured_on(green, lambda: VocoderLoop(args.vocoder_streams, args.chunk_frames))
        except Exception as exc:
            modes[f"green-{num_sms}"] = {"error": f"capture: {type(exc).__name__}: {str(exc)[:300]}"}
            print(f"green-{num_sms}", modes[f"green-{num_sms}"], flush=True)
            continue
        attempt(f"green-{num_sms}-vocoder-alone",
                lambda: run_together({"vocoder": captured}, {"vocoder": green}, args.seconds))  # noqa: B023  # fmt: skip
        attempt(f"green-{num_sms}", lambda: run_together(
            {"talker": talker, "vocoder": captured}, {"talker": high, "vocoder": green}, args.seconds  # noqa: B023
        ))  # fmt: skip
        captured.runner.close()
    talker_alone, vocoder_alone = (modes["alone"][name]["audio_s_per_s"] for name in ("talker", "vocoder"))
    serial = 1 / (1 / talker_alone + 1 / vocoder_alone)
    for label, mode in modes.items():
        if "talker" in mode and "vocoder" in mode:
            together = (mode[name]["audio_s_per_s"] for name in ("talker", "vocoder"))
            mode["capacity_audio_s_per_s"] = round(capacity(talker_alone, vocoder_alone, *together), 1)
            print(label, "capacity", mode["capacity_audio_s_per_s"], flush=True)
    print(f"serial capacity (one after the other): {serial:.1f} audio-s/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"overlap-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {"benchmark": "overlap", "commit": commit(), "device": torch.cuda.get_device_name(),
              "settings": vars(args) | {"out": str(args.out)}, "serial_capacity_audio_s_per_s": round(serial, 1),
              "modes": modes}  # fmt: skip
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()

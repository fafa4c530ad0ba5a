"""Times one peer engine on a local checkpoint; run by `run_peer.py` with the PEER's Python, never Chorus's.

Usage: peer_worker.py PEER CHECKPOINT OUT_JSON SETTINGS_JSON. Writes OUT_JSON in every case: the stages it
passed, the timings, and on failure `failed_stage` + a one-line `reason`. Imports only the peer's environment
(faster-qwen3-tts, qwen-tts-hf or for the batch peer qwen-tts, torch), so it must not import chorus.

Every request is an x-vector voice clone of the same 3 s reference: the one mode both peers serve
(faster-qwen3-tts-batch only batches voice clones). Length is forced with min_new_tokens = max_new_tokens, so
each request yields exactly `frames` codec frames; times include the peers' own codec decode to waveform.
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
import wave
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

TEXT = "The quick brown fox jumps over the lazy dog, then rests in the shade of an old oak tree by the river."
LANGUAGE = "English"
SAMPLE_RATE_HZ = 24000
SAMPLES_PER_FRAME = 1920  # 12.5 Hz codec frames at 24 kHz
STREAM_CHUNK_FRAMES = 12  # faster-qwen3-tts's default streaming chunk


class StageFailed(Exception):
    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(f"{stage}: {type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}")
        self.stage = stage


def write_reference_wav(folder: Path) -> Path:
    """3 s of a chirp plus noise, 16-bit PCM: the x-vector prompt's source; its content does not change timing."""
    generator = np.random.default_rng(5)
    t = np.arange(3 * SAMPLE_RATE_HZ) / SAMPLE_RATE_HZ
    wav = 0.5 * np.sin(2 * math.pi * (200 + 300 * t) * t) + 0.05 * generator.standard_normal(t.shape)
    path = folder / "reference.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE_HZ)
        out.writeframes((np.clip(wav, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def num_frames(audio) -> float:
    return len(np.asarray(audio).reshape(-1)) / SAMPLES_PER_FRAME


def probe_checkpoint(checkpoint: str, reference: Path, settings: dict) -> dict:
    """Load the checkpoint with the peer's model code (qwen-tts(-hf), eager transformers generate) and synthesize
    once. Shows the checkpoint and offline loading work in the peer's env even where its engine cannot run."""
    from qwen_tts import Qwen3TTSModel

    start = time.perf_counter()
    model = Qwen3TTSModel.from_pretrained(
        checkpoint, device_map=settings["device"], dtype=getattr(torch, settings["dtype"])
    )
    load_s = time.perf_counter() - start
    # Proof the local weights were read, not initialized: one tensor compared with the file.
    with safe_open(Path(checkpoint, "model.safetensors"), "pt") as weights:
        stored = weights.get_tensor("talker.codec_head.weight")
    loaded = model.model.talker.codec_head.weight.detach().cpu()
    # qwen-tts fixes min_new_tokens at 2, so the length is capped here, not forced; seeded, so runs repeat.
    torch.manual_seed(0)
    start = time.perf_counter()
    wavs, sample_rate_hz = model.generate_voice_clone(
        text=TEXT,
        language=LANGUAGE,
        ref_audio=str(reference),
        x_vector_only_mode=True,
        max_new_tokens=settings["frames"],
    )
    wall_s = time.perf_counter() - start
    return {
        "what": "qwen_tts eager generate (the peer's model code, not its engine)",
        "load_s": round(load_s, 2),
        "weights_match_file": bool(torch.equal(loaded, stored.to(loaded.dtype))),
        "num_frames": num_frames(wavs[0]),
        "sample_rate_hz": sample_rate_hz,
        "wall_s": round(wall_s, 3),
    }


def request_kwargs(reference: Path, frames: int) -> dict:
    return dict(
        text=TEXT,
        language=LANGUAGE,
        ref_audio=str(reference),
        xvec_only=True,
        max_new_tokens=frames,
        min_new_tokens=frames,
    )


def summarize(batch_size: int, walls: list[float], frames: list[float], device: str) -> dict:
    wall_s = statistics.median(walls)
    audio_s = statistics.median(frames) * SAMPLES_PER_FRAME / SAMPLE_RATE_HZ
    row = {
        "batch_size": batch_size,
        "frames_per_request": statistics.median(frames),
        "wall_s": round(wall_s, 4),
        "rtf": round(wall_s / audio_s, 4),
        "audio_s_per_s": round(batch_size * audio_s / wall_s, 1),
    }
    if device.startswith("cuda"):
        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return row


def time_single(model, reference: Path, settings: dict) -> dict:
    """faster-qwen3-tts: one request at a time (it has no batching), non-streaming and streaming."""
    kwargs = request_kwargs(reference, settings["frames"])
    model.generate_voice_clone(**kwargs)  # captures the CUDA graphs; not timed
    walls, frames = [], []
    for _ in range(settings["repeats"]):
        start = time.perf_counter()
        wavs, _ = model.generate_voice_clone(**kwargs)
        sync(settings["device"])
        walls.append(time.perf_counter() - start)
        frames.append(num_frames(wavs[0]))
    row = summarize(1, walls, frames, settings["device"])
    firsts, stream_walls = [], []
    for _ in range(settings["repeats"]):
        start, first = time.perf_counter(), None
        for _chunk, _sr, _timing in model.generate_voice_clone_streaming(**kwargs, chunk_size=STREAM_CHUNK_FRAMES):
            first = first or time.perf_counter() - start
        stream_walls.append(time.perf_counter() - start)
        firsts.append(first)
    row["streaming"] = {
        "chunk_frames": STREAM_CHUNK_FRAMES,
        "time_to_first_audio_s": round(statistics.median(firsts), 4),
        "wall_s": round(statistics.median(stream_walls), 4),
    }
    return row


def time_batches(base, reference: Path, settings: dict) -> list[dict]:
    """faster-qwen3-tts-batch: a full batch of identical requests per call, graphs captured per batch size."""
    from faster_qwen3_tts_batch import BatchedFasterQwen3TTS

    kwargs = request_kwargs(reference, settings["frames"])
    shared = {k: v for k, v in kwargs.items() if k in ("max_new_tokens", "min_new_tokens", "xvec_only")}
    one = {"text": kwargs["text"], "language": kwargs["language"], "ref_audio": kwargs["ref_audio"]}
    rows = []
    for batch_size in settings["batch_sizes"]:
        engine = None
        try:
            if settings["device"].startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            engine = BatchedFasterQwen3TTS(base, max_batch_size=batch_size, max_seq_len=base.max_seq_len)
            requests = [dict(one) for _ in range(batch_size)]
            engine.generate_voice_clone_batch(requests, **shared)  # captures this size's graphs; not timed
            walls, frames = [], []
            for _ in range(settings["repeats"]):
                start = time.perf_counter()
                outputs = engine.generate_voice_clone_batch(requests, **shared)
                sync(settings["device"])
                walls.append(time.perf_counter() - start)
                frames.append(min(num_frames(wavs[0]) for wavs, _ in outputs))
            rows.append(summarize(batch_size, walls, frames, settings["device"]))
        except Exception as error:  # one size failing (often out of memory) keeps the sizes already timed
            rows.append(
                {"batch_size": batch_size, "error": f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}
            )
        finally:
            del engine
            if settings["device"].startswith("cuda"):
                torch.cuda.empty_cache()
        print(f"  batch {batch_size}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    return rows


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def run(peer: str, checkpoint: str, settings: dict, report: dict) -> None:
    report["stages"] = []

    def stage(name, fn):
        try:
            value = fn()
        except Exception as error:  # any failure is the peer's result, reported as one line
            traceback.print_exc()
            raise StageFailed(name, error) from error
        report["stages"].append(name)
        return value

    module = "faster_qwen3_tts" if peer == "faster-qwen3-tts" else "faster_qwen3_tts_batch"
    stage("import", lambda: importlib.import_module(module))
    import faster_qwen3_tts

    # Each peer's env holds one of qwen-tts-hf (faster-qwen3-tts) and qwen-tts (the batch peer's transformers-4 set).
    names = ("faster-qwen3-tts", "faster-qwen3-tts-batch", "qwen-tts-hf", "qwen-tts", "transformers", "torch")
    report["versions"] = {name: installed_version(name) for name in names if installed_version(name)}
    device = settings["device"]
    report["device"] = (
        torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)"
    )
    work = Path(tempfile.mkdtemp(prefix="peer-"))
    reference = write_reference_wav(work)
    if settings["probe"]:
        report["probe"] = stage("probe_checkpoint", lambda: probe_checkpoint(checkpoint, reference, settings))
    dtype = getattr(torch, settings["dtype"])
    model = stage(
        "load_engine",
        lambda: faster_qwen3_tts.FasterQwen3TTS.from_pretrained(checkpoint, device=device, dtype=dtype),
    )
    if peer == "faster-qwen3-tts":
        report["concurrency_1"] = stage("time_single", lambda: time_single(model, reference, settings))
        report["batches"] = [dict(report["concurrency_1"])]
        report["batching"] = "none: no batch API, and its CUDA graphs hold one request's static buffers"
    else:
        report["batches"] = stage("time_batches", lambda: time_batches(model, reference, settings))
        report["concurrency_1"] = next((r for r in report["batches"] if r["batch_size"] == 1), None)
    timed = [r for r in report["batches"] if "audio_s_per_s" in r]
    report["best_batch"] = max(timed, key=lambda r: r["audio_s_per_s"]) if timed else None


def main(peer: str, checkpoint: str, out_path: str, settings_json: str) -> int:
    settings = json.loads(settings_json)
    report: dict = {"peer": peer, "reason": None, "failed_stage": None}
    code = 0
    try:
        run(peer, checkpoint, settings, report)
    except StageFailed as failure:
        report["failed_stage"], report["reason"], code = failure.stage, str(failure), 3
    Path(out_path).write_text(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

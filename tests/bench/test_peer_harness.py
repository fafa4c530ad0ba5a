"""The peer benchmark's harness (bench/peers): its checkpoint loads in Chorus, and where a peer's env exists
(`.venv-peers`, `.venv-peers-hf4` for the batch peer), that peer engine gets as far as this machine allows (on CPU:
the checkpoint loads and synthesizes through the peer's model code, then the engine stops at its CUDA requirement)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chorus.talker.loader import load_checkpoint
from chorus.vocoder.loader import load_codec

REPO = Path(__file__).resolve().parents[2]
PEERS_DIR = REPO / "bench" / "peers"
# Each peer's env and the command that builds it (run_peer.py's PEER_ENVS): the batch engine needs transformers 4.
PEER_ENVS = {
    "faster-qwen3-tts": (REPO / ".venv-peers" / "bin" / "python", "bench/peers/make_env.sh"),
    "faster-qwen3-tts-batch": (REPO / ".venv-peers-hf4" / "bin" / "python", "bench/peers/make_env.sh --hf4"),
}
OFFICIAL_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "speech_tokenizer/config.json",
    "speech_tokenizer/preprocessor_config.json",
    "speech_tokenizer/model.safetensors",
}


def _bench_module(name: str):
    """bench/peers is a folder of scripts, not a package: load one by path."""
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return _bench_module("write_checkpoint").write_checkpoint(tmp_path_factory.mktemp("peers") / "tiny")


def test_checkpoint_has_the_official_layout_and_loads_in_chorus(tiny_checkpoint):
    files = {path.relative_to(tiny_checkpoint).as_posix() for path in tiny_checkpoint.rglob("*") if path.is_file()}
    assert files == OFFICIAL_FILES
    talker = load_checkpoint(tiny_checkpoint)
    assert talker.config.model_type == "base"
    assert talker.tokenizer.encode("<|im_start|>assistant\n<|im_end|>")[0] == 151644
    assert load_codec(str(tiny_checkpoint)).config.decoder.codebook_dim == 16


def test_released_shapes_are_the_base_model():
    config = _bench_module("write_checkpoint").base_config("0.6b")
    assert (config.model_type, config.model_size, config.talker.hidden_size) == ("base", "0b6", 1024)
    assert config.speaker_encoder.enc_dim == 1024 and config.speaker_ids == {}


def test_a_worker_cut_off_by_the_timeout_keeps_the_sizes_it_timed():
    """The rows a worker printed before the timeout stopped it go in the report, marked as read from its log."""
    log = (
        "Capturing CUDA graph for batched predictor...\n"
        '  batch 64: {"batch_size": 64, "wall_s": 15.1, "audio_s_per_s": 42.3}\n'
        '  batch 128: {"batch_size": 128, "error": "OutOfMemoryError: CUDA out of memory."}\n'
        '  batch 1: {"batch_size": 1, "wall_s": 3.6, "audio_s_per_s": 2.7}\n'
    )
    kept = _bench_module("run_peer").timed_before_the_end(log)
    assert [row["batch_size"] for row in kept["batches"]] == [64, 128, 1]
    assert kept["best_batch"]["batch_size"] == 64 and kept["batches_from_log"]
    assert _bench_module("run_peer").timed_before_the_end("Warming up...\n") == {}


@pytest.mark.parametrize("peer", list(PEER_ENVS))
def test_peer_runs_as_far_as_this_device_allows(peer, tiny_checkpoint, tmp_path):
    python, builder = PEER_ENVS[peer]
    if not python.exists():
        pytest.skip(f"{peer}'s env missing: run {builder}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    command = [sys.executable, str(PEERS_DIR / "run_peer.py"), peer, "--checkpoint", str(tiny_checkpoint)]
    options = ["--device", device, "--dtype", "float32", "--frames", "25", "--batch-sizes", "1,2", "--repeats", "1"]
    completed = subprocess.run(
        [*command, *options, "--probe", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    report = json.loads(next(tmp_path.glob(f"peers-{peer}-*.json")).read_text())
    assert report["probe"]["weights_match_file"], report
    if peer == "faster-qwen3-tts-batch":  # its env is the transformers-4 set (make_env.sh --hf4)
        assert report["versions"]["transformers"].startswith("4.") and "qwen-tts" in report["versions"]
    assert report["probe"]["num_frames"] > 0
    if device == "cpu":
        assert completed.returncode == 3, completed.stdout
        assert report["reason"] == "load_engine: ValueError: CUDA graphs require CUDA device"
    else:
        assert completed.returncode == 0, report["reason"]
        assert report["concurrency_1"]["frames_per_request"] == 25


class _FakeEngine:
    """Stands in for a peer engine's API (shapes only) so the timing code runs without CUDA or the peer env."""

    sample_rate = 24000
    max_seq_len = 2048

    def __init__(self, base=None, max_batch_size: int = 1, max_seq_len: int = 2048) -> None:
        self.max_batch_size = max_batch_size

    def generate_voice_clone(self, max_new_tokens, min_new_tokens, **request):
        return [torch.zeros(min_new_tokens * 1920).numpy()], self.sample_rate

    def generate_voice_clone_streaming(self, max_new_tokens, min_new_tokens, chunk_size, **request):
        for _ in range(0, min_new_tokens, chunk_size):
            yield torch.zeros(chunk_size * 1920).numpy(), self.sample_rate, {}

    def generate_voice_clone_batch(self, requests, max_new_tokens, min_new_tokens, xvec_only):
        assert len(requests) <= self.max_batch_size and xvec_only
        return [self.generate_voice_clone(max_new_tokens, min_new_tokens) for _ in requests]


def test_timing_rows_count_forced_frames_and_pick_the_best_batch(tmp_path, monkeypatch):
    worker = _bench_module("peer_worker")
    monkeypatch.setitem(sys.modules, "faster_qwen3_tts_batch", type(sys)("fake"))
    sys.modules["faster_qwen3_tts_batch"].BatchedFasterQwen3TTS = _FakeEngine
    settings = {"device": "cpu", "frames": 125, "repeats": 2, "batch_sizes": [1, 4]}
    reference = worker.write_reference_wav(tmp_path)
    single = worker.time_single(_FakeEngine(), reference, settings)
    assert single["frames_per_request"] == 125 and single["streaming"]["chunk_frames"] == 12
    assert single["rtf"] == pytest.approx(single["wall_s"] / 10.0, rel=1e-2, abs=1e-4)
    rows = worker.time_batches(_FakeEngine(), reference, settings)
    assert [row["batch_size"] for row in rows] == [1, 4]
    assert all(row["frames_per_request"] == 125 for row in rows)

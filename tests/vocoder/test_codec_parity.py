"""Parity with the official qwen-tts 0.1.1 codec on a small random checkpoint in the official layout."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from vocoder_helpers import random_codes

from chorus.vocoder.loader import CheckpointError, load_codec

REPO = Path(__file__).resolve().parents[2]
REFERENCE_PYTHON = REPO / ".venv-ref" / "bin" / "python"
NUM_FRAMES = (1, 7, 71, 72, 73, 150, 300)
BATCH_FRAMES = (40, 120, 9)

pytestmark = [
    pytest.mark.parity,
    pytest.mark.skipif(not REFERENCE_PYTHON.exists(), reason="reference env missing: run `make ref-env`"),
]


def _test_waveform() -> torch.Tensor:
    """2.3 s of a chirp plus noise at 24 kHz: enough structure to spread codes over the codebooks."""
    generator = torch.Generator().manual_seed(5)
    t = torch.arange(int(2.3 * 24000)) / 24000
    chirp = 0.5 * torch.sin(2 * math.pi * (200 + 900 * t) * t)
    return (chirp + 0.05 * torch.randn(t.shape, generator=generator)).float()


@pytest.fixture(scope="module")
def reference(tiny_folder, tmp_path_factory):
    """Outputs of the official tokenizer on `tiny_folder`, computed once in the reference environment."""
    work = tmp_path_factory.mktemp("reference")
    inputs = {f"codes.{n}": random_codes(n, seed=n)[0] for n in NUM_FRAMES}
    batch = torch.full((len(BATCH_FRAMES), max(BATCH_FRAMES), 16), -1, dtype=torch.int64)
    for row, num_frames in enumerate(BATCH_FRAMES):
        batch[row, :num_frames] = random_codes(num_frames, seed=1000 + row)[0]
    inputs.update(batch=batch, wav=_test_waveform())
    save_file(inputs, work / "inputs.safetensors")
    script = Path(__file__).with_name("reference_codec.py")
    command = [str(REFERENCE_PYTHON), str(script), str(tiny_folder), str(work / "inputs.safetensors")]
    subprocess.run([*command, str(work / "outputs.safetensors")], check=True, capture_output=True, timeout=600)
    return inputs, load_file(work / "outputs.safetensors")


@pytest.fixture(scope="module")
def loaded(tiny_folder):
    """Our codec, loaded from the same folder through the production loader."""
    return load_codec(str(tiny_folder))


def _decode(codec, codes: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        waveform, _ = codec.decoder(codes, codec.decoder.new_state(codes.shape[0]))
    return waveform


@pytest.mark.parametrize("num_frames", NUM_FRAMES)
def test_decoder_matches_reference(reference, loaded, num_frames):
    inputs, outputs = reference
    ours = _decode(loaded, inputs[f"codes.{num_frames}"][None])[0]
    theirs = outputs[f"wav.{num_frames}"]
    assert ours.shape == theirs.shape == (num_frames * 1920,)
    assert (theirs.abs() < 0.99).float().mean() > 0.9, "reference output saturated: the comparison would be vacuous"
    assert theirs.std() > 0.05
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_padded_batch_matches_reference(reference, loaded):
    inputs, outputs = reference
    for row, num_frames in enumerate(BATCH_FRAMES):
        ours = _decode(loaded, inputs["batch"][row : row + 1, :num_frames])[0]
        assert (ours - outputs[f"batch.{row}"]).abs().max().item() <= 1e-4


def test_encoder_codes_match_reference(reference, loaded):
    inputs, outputs = reference
    with torch.inference_mode():
        ours = loaded.encoder(inputs["wav"][None])[0]
    theirs = outputs["codes"]
    assert ours.shape == theirs.shape == (math.ceil(inputs["wav"].numel() / 1920), 16)
    assert theirs[:, 1:].unique().numel() > 20, "codes collapsed onto a few entries: the comparison would be vacuous"
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("damage", ["missing", "unexpected"])
def test_loader_names_missing_and_unexpected_keys(tiny_folder, tmp_path, damage):
    tensors = load_file(tiny_folder / "model.safetensors")
    broken = tmp_path / "speech_tokenizer"
    broken.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (broken / name).write_text((tiny_folder / name).read_text())
    if damage == "missing":
        del tensors["decoder.pre_conv.conv.bias"]
        expected = r"missing keys \['decoder\.pre_conv\.conv\.bias'\]"
    else:
        tensors["decoder.extra.weight"] = torch.zeros(1)
        expected = r"unexpected keys \['decoder\.extra\.weight'\]"
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(CheckpointError, match=expected):
        load_codec(str(tmp_path))

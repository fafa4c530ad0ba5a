"""Loading: the official directory layout, seeded presets, and the fp32 time embedding."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import torch

from chorus.diffusion.dit import StableAudioDenoiser
from chorus.diffusion.engine.runner import DiffusionRunner, SampleSpec
from chorus.diffusion.loader import load_models, resolve_model_directory
from chorus.diffusion.presets import build_random_components, write_checkpoint

_DIGEST_SCRIPT = """
import hashlib
from chorus.diffusion.presets import build_random_components
c = build_random_components("tiny", seed=3)
digest = hashlib.sha256()
for module in (c.transformer, c.vae, c.projection_model, c.text_encoder):
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode()); digest.update(tensor.contiguous().numpy().tobytes())
print(digest.hexdigest())
"""


def test_tiny_preset_is_identical_across_processes():
    components = build_random_components("tiny", seed=3)
    digest = hashlib.sha256()
    for module in (components.transformer, components.vae, components.projection_model, components.text_encoder):
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.contiguous().numpy().tobytes())
    other_process = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], capture_output=True, text=True, check=True)
    assert other_process.stdout.strip() == digest.hexdigest()
    assert all(bool(p.isfinite().all()) for p in components.transformer.parameters())


def test_official_layout_round_trip(tmp_path, tiny_models):
    directory = write_checkpoint(tmp_path / "stable-audio-open", "tiny", seed=0)
    index = json.loads((directory / "model_index.json").read_text())
    assert index["transformer"] == ["diffusers", "StableAudioDiTModel"]
    loaded = load_models(str(directory), device="cpu", dtype="float32")
    assert loaded.max_duration_s == pytest.approx(tiny_models.max_duration_s)
    assert loaded.tokenizer("a dog barks").input_ids == tiny_models.tokenizer("a dog barks").input_ids
    spec = SampleSpec("a dog barks", "noise", 0.0, 0.4, 5.0, 4, seed=3)
    (from_disk,) = DiffusionRunner(loaded).generate([spec])
    (in_memory,) = DiffusionRunner(tiny_models).generate([spec])
    torch.testing.assert_close(from_disk, in_memory)


def test_bad_model_and_scheduler_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="model"):
        load_models(str(tmp_path), device="cpu")
    directory = write_checkpoint(tmp_path / "ckpt", "tiny")
    config_path = directory / "scheduler" / "scheduler_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "solver_order": 3}))
    with pytest.raises(ValueError, match="solver_order"):
        load_models(str(directory), device="cpu")


def test_half_precision_dit_keeps_every_timestep_distinct():
    """100 steps: the stock forward rounds t to bf16 first (64 distinct embeddings); ours keeps 100."""
    models = load_models("tiny", device="cpu", dtype="bfloat16")
    transformer = models.transformer
    assert transformer.dtype == torch.bfloat16 and models.time_frequencies.dtype == torch.float32
    sigmas = torch.linspace(torch.log(torch.tensor(0.3)), torch.log(torch.tensor(500.0)), 100).exp()
    timesteps = sigmas.atan() / torch.pi * 2
    denoiser = StableAudioDenoiser(transformer, models.time_frequencies)
    ours = denoiser._time_features(timesteps)
    stock = transformer.time_proj(timesteps.to(torch.bfloat16))
    assert ours.dtype == torch.float32 and torch.unique(ours, dim=0).shape[0] == 100
    assert torch.unique(stock, dim=0).shape[0] < 100
    latents = torch.randn(2, models.num_latent_channels, models.num_latent_frames)
    cross = torch.randn(2, 130, 16)
    velocity = denoiser(latents, timesteps[:2], cross, torch.randn(2, 1, 32))
    assert velocity.dtype == torch.bfloat16 and velocity.shape == latents.shape


def test_repo_id_resolves_from_the_local_hf_cache_only(tmp_path):
    snapshot = tmp_path / "models--stabilityai--stable-audio-open-1.0" / "snapshots" / "0123abcd"
    write_checkpoint(snapshot, "tiny")
    (tmp_path / "models--stabilityai--stable-audio-open-1.0" / "refs").mkdir()
    (tmp_path / "models--stabilityai--stable-audio-open-1.0" / "refs" / "main").write_text("0123abcd")
    assert resolve_model_directory("stabilityai/stable-audio-open-1.0", cache_dir=str(tmp_path)) == snapshot
    with pytest.raises(ValueError, match="local HF cache"):
        resolve_model_directory("stabilityai/not-cached", cache_dir=str(tmp_path))


def test_bfloat16_dit_generation_stays_close_to_float32(tiny_models):
    """Only the DiT runs in bf16; the sampler state stays fp32, so the result drifts by well under 1%."""
    half = load_models("tiny", device="cpu", dtype="bfloat16", vae_dtype="float32")
    assert half.text_encoder.dtype == torch.float32 and half.vae.dtype == torch.float32
    spec = SampleSpec("a dog barks", "hiss", 0.0, 0.5, 7.0, 10, seed=1)
    (reference,) = DiffusionRunner(tiny_models).generate([spec])
    (ours,) = DiffusionRunner(half).generate([spec])
    assert ours.dtype == torch.float32
    assert float((ours - reference).norm() / reference.norm()) < 0.02


def test_dummy_preset_has_the_released_sizes():
    """Built on the meta device: shapes only, no memory."""
    components = build_random_components("dummy", device="meta")
    num_params_m = {
        name: sum(p.numel() for p in getattr(components, name).parameters()) / 1e6
        for name in ("transformer", "vae", "projection_model", "text_encoder")
    }
    assert num_params_m == pytest.approx(
        {"transformer": 1056.94, "vae": 156.11, "projection_model": 0.40, "text_encoder": 109.63}, abs=0.01
    )
    assert int(components.transformer.config.sample_size) * 2048 / 44100 == pytest.approx(47.55, abs=0.01)

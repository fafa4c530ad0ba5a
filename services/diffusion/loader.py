"""Loads Stable Audio Open for the engine: an official directory as is, or a seeded random preset.

Dtype policy lives here and nowhere else: the DiT runs in `dtype` (fp16/bf16 on GPUs) but keeps an fp32
copy of its Fourier time frequencies so timesteps are never rounded to half precision; T5 and the
projection model stay fp32 (a few GFLOP per prompt); the VAE runs in `vae_dtype`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import AutoencoderOobleck, StableAudioDiTModel
from diffusers.pipelines.stable_audio import StableAudioProjectionModel
from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
from transformers import PreTrainedTokenizerBase, T5EncoderModel, T5TokenizerFast

from chorus.diffusion.presets import PRESETS, SCHEDULER_CONFIG, build_random_components

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# What the sampler implements: diffusers' CosineDPMSolverMultistepScheduler as released.
_SUPPORTED_SCHEDULER = {
    "prediction_type": "v_prediction",
    "sigma_schedule": "exponential",
    "solver_order": 2,
    "solver_type": "midpoint",
    "final_sigmas_type": "zero",
    "euler_at_final": False,
}


@dataclass(frozen=True, slots=True)
class NoiseSchedule:
    """The scheduler_config.json values the sampler needs."""

    sigma_min: float
    sigma_max: float
    sigma_data: float

    @property
    def init_noise_sigma(self) -> float:
        return (self.sigma_max**2 + 1) ** 0.5


@dataclass(slots=True)
class StableAudioModels:
    """Every component the engine runs, on one device, in eval mode."""

    tokenizer: PreTrainedTokenizerBase
    text_encoder: T5EncoderModel
    projection_model: StableAudioProjectionModel
    transformer: StableAudioDiTModel
    vae: AutoencoderOobleck
    schedule: NoiseSchedule
    time_frequencies: torch.Tensor  # (time_proj_dim // 2,) fp32 copy of transformer.time_proj.weight
    device: torch.device

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.dtype

    @property
    def sample_rate_hz(self) -> int:
        return int(self.vae.config.sampling_rate)

    @property
    def num_audio_channels(self) -> int:
        return int(self.vae.config.audio_channels)

    @property
    def num_latent_channels(self) -> int:
        return int(self.transformer.config.in_channels)

    @property
    def num_latent_frames(self) -> int:
        # The released config stores sample_size as the float 1024.0.
        return int(self.transformer.config.sample_size)

    @property
    def hop_samples(self) -> int:
        return int(self.vae.hop_length)

    @property
    def max_duration_s(self) -> float:
        """Length of the generated window: 47.55 s for the release."""
        return self.num_latent_frames * self.hop_samples / self.sample_rate_hz


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(_DTYPES)} or auto, got {dtype!r}")
    return _DTYPES[dtype]


def load_models(
    model: str,
    load_format: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    vae_dtype: str | None = None,
    seed: int = 0,
) -> StableAudioModels:
    """Loads `model`: a preset name ("tiny", "dummy"), a stable-audio-open-1.0 directory, or its HF repo id
    when the local HF cache holds it.

    load_format "dummy" builds released-size random weights whatever `model` names; `seed` seeds
    random builds. `vae_dtype` None means the same dtype as the DiT.
    """
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"load_format: expected auto or dummy, got {load_format!r}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    torch_vae_dtype = torch_dtype if vae_dtype is None else resolve_dtype(vae_dtype, torch_device)
    if load_format == "dummy" or model in PRESETS:
        preset = "dummy" if load_format == "dummy" else model
        components = build_random_components(preset, seed, torch_device)
        parts = (components.tokenizer, components.text_encoder, components.projection_model)
        transformer, vae, scheduler_config = components.transformer, components.vae, SCHEDULER_CONFIG
    else:
        parts, transformer, vae, scheduler_config = _read_directory(resolve_model_directory(model))
    tokenizer, text_encoder, projection_model = parts
    time_frequencies = transformer.time_proj.weight.detach().to(torch_device, torch.float32).clone()
    return StableAudioModels(
        tokenizer=tokenizer,
        text_encoder=_place(text_encoder, torch_device, torch.float32),
        projection_model=_place(projection_model, torch_device, torch.float32),
        transformer=_place(transformer, torch_device, torch_dtype),
        vae=_place(vae, torch_device, torch_vae_dtype),
        schedule=_noise_schedule(scheduler_config),
        time_frequencies=time_frequencies,
        device=torch_device,
    )


def _place(module: torch.nn.Module, device: torch.device, dtype: torch.dtype):
    # Only cast when needed: diffusers logs a warning on every dtype cast through `.to()`.
    module = module.to(device)
    if next(module.parameters()).dtype != dtype:
        module = module.to(dtype)
    return module.eval()


def resolve_model_directory(model: str, cache_dir: str | None = None) -> Path:
    """A local directory as is; an HF repo id ("stabilityai/stable-audio-open-1.0") from the local HF cache
    only, never the network."""
    directory = Path(model)
    if not directory.is_dir() and model.count("/") == 1:
        with contextlib.suppress(LocalEntryNotFoundError, HFValidationError):
            directory = Path(snapshot_download(model, cache_dir=cache_dir, local_files_only=True))
    if not (directory / "model_index.json").is_file():
        raise ValueError(
            f"model: {model!r} is not a preset ({sorted(PRESETS)}), a directory with model_index.json "
            "or a repo id in the local HF cache"
        )
    return directory


def _read_directory(directory: Path):
    scheduler_config = json.loads((directory / "scheduler" / "scheduler_config.json").read_text())
    tokenizer = T5TokenizerFast.from_pretrained(directory / "tokenizer")
    text_encoder = T5EncoderModel.from_pretrained(directory / "text_encoder", dtype=torch.float32)
    projection_model = StableAudioProjectionModel.from_pretrained(directory, subfolder="projection_model")
    # fp32 first, so the time frequencies are copied before any down-cast.
    transformer = StableAudioDiTModel.from_pretrained(directory, subfolder="transformer", torch_dtype=torch.float32)
    vae = AutoencoderOobleck.from_pretrained(directory, subfolder="vae")
    for module in (text_encoder, projection_model, transformer, vae):
        module.requires_grad_(False)
    return (tokenizer, text_encoder, projection_model), transformer, vae, scheduler_config


def _noise_schedule(scheduler_config: dict) -> NoiseSchedule:
    for key, expected in _SUPPORTED_SCHEDULER.items():
        value = scheduler_config.get(key, SCHEDULER_CONFIG[key])
        if value != expected:
            raise ValueError(f"scheduler_config.{key}: the sampler implements {expected!r}, got {value!r}")
    return NoiseSchedule(
        sigma_min=float(scheduler_config.get("sigma_min", SCHEDULER_CONFIG["sigma_min"])),
        sigma_max=float(scheduler_config.get("sigma_max", SCHEDULER_CONFIG["sigma_max"])),
        sigma_data=float(scheduler_config.get("sigma_data", SCHEDULER_CONFIG["sigma_data"])),
    )

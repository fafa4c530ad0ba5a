"""Stable Audio Open component configs (released and tiny) and seeded random builds of them.

Nothing here downloads: the released configs are the `stable-audio-open-1.0` JSON files written out as
dicts, the T5 tokenizer is built from an in-code vocabulary, and weights are random but seeded, so two
processes that build the same preset with the same seed get identical weights (on the same device type).
`write_checkpoint` saves a build in the official `model_index.json` layout, which `loader` reads as is.
"""

from __future__ import annotations

import json
import math
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderOobleck, StableAudioDiTModel
from diffusers.pipelines.stable_audio import StableAudioProjectionModel
from transformers import T5Config, T5EncoderModel, T5Tokenizer

TOKENIZER_MAX_LENGTH = 128

# The released `scheduler/scheduler_config.json`; the tiny preset uses it too, because the sampler math
# does not depend on model size.
SCHEDULER_CONFIG: dict[str, Any] = {
    "_class_name": "CosineDPMSolverMultistepScheduler",
    "euler_at_final": False,
    "final_sigmas_type": "zero",
    "lower_order_final": True,
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "rho": 7.0,
    "sigma_data": 1.0,
    "sigma_max": 500,
    "sigma_min": 0.3,
    "sigma_schedule": "exponential",
    "solver_order": 2,
    "solver_type": "midpoint",
}


@dataclass(frozen=True, slots=True)
class PresetConfigs:
    """Constructor kwargs of every component of one preset."""

    transformer: dict[str, Any]
    vae: dict[str, Any]
    projection_model: dict[str, Any]
    text_encoder: dict[str, Any]


RELEASED = PresetConfigs(
    transformer={
        "attention_head_dim": 64,
        "cross_attention_dim": 768,
        "cross_attention_input_dim": 768,
        "global_states_input_dim": 1536,
        "in_channels": 64,
        "num_attention_heads": 24,
        "num_key_value_attention_heads": 12,
        "num_layers": 24,
        "out_channels": 64,
        "sample_size": 1024.0,
        "time_proj_dim": 256,
    },
    vae={
        "audio_channels": 2,
        "channel_multiples": [1, 2, 4, 8, 16],
        "decoder_channels": 128,
        "decoder_input_channels": 64,
        "downsampling_ratios": [2, 4, 4, 8, 8],
        "encoder_hidden_size": 128,
        "sampling_rate": 44100,
    },
    projection_model={"conditioning_dim": 768, "text_encoder_dim": 768, "min_value": 0, "max_value": 512},
    text_encoder={
        "d_model": 768,
        "d_ff": 3072,
        "d_kv": 64,
        "num_layers": 12,
        "num_heads": 12,
        "feed_forward_proj": "relu",
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6,
        "dropout_rate": 0.1,
        "vocab_size": 32128,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    },
)

# Same structure and sample rate as the release, small enough for CPU tests: a 128-latent window with a
# 256-sample hop is 32768 samples (0.74 s) of 44.1 kHz stereo.
TINY = PresetConfigs(
    transformer={
        "attention_head_dim": 8,
        "cross_attention_dim": 16,
        "cross_attention_input_dim": 16,
        "global_states_input_dim": 32,
        "in_channels": 8,
        "num_attention_heads": 4,
        "num_key_value_attention_heads": 2,
        "num_layers": 2,
        "out_channels": 8,
        "sample_size": 128.0,
        "time_proj_dim": 16,
    },
    vae={
        "audio_channels": 2,
        "channel_multiples": [1, 2, 4],
        "decoder_channels": 8,
        "decoder_input_channels": 8,
        "downsampling_ratios": [4, 8, 8],
        "encoder_hidden_size": 8,
        "sampling_rate": 44100,
    },
    projection_model={"conditioning_dim": 16, "text_encoder_dim": 16, "min_value": 0, "max_value": 512},
    text_encoder={
        "d_model": 16,
        "d_ff": 32,
        "d_kv": 8,
        "num_layers": 2,
        "num_heads": 2,
        "feed_forward_proj": "relu",
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6,
        "dropout_rate": 0.0,
        "vocab_size": 32128,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    },
)

PRESETS = {"tiny": TINY, "dummy": RELEASED}


def build_tokenizer() -> T5Tokenizer:
    """A T5 tokenizer with the real special ids (<pad> 0, </s> 1, <unk> 2, 100 extra ids) and a
    character-level Unigram vocabulary, built without any file: ids differ from t5-base's, which does not
    matter for random weights and keeps every id below the released embedding size."""
    pieces = ["▁", *("▁" + c for c in string.ascii_letters + string.digits)]
    pieces += list(string.ascii_letters + string.digits + string.punctuation)
    log_probability = -math.log(len(pieces))
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *((piece, log_probability) for piece in pieces)]
    return T5Tokenizer(vocab=vocab, extra_ids=100, model_max_length=TOKENIZER_MAX_LENGTH)


@dataclass(slots=True)
class RandomComponents:
    """Freshly built float32 modules of one preset, in eval mode."""

    transformer: StableAudioDiTModel
    vae: AutoencoderOobleck
    projection_model: StableAudioProjectionModel
    text_encoder: T5EncoderModel
    tokenizer: T5Tokenizer


def build_random_components(preset: str, seed: int = 0, device: str | torch.device = "cpu") -> RandomComponents:
    """Builds every component of `preset` ("tiny" or "dummy") with seeded random weights on `device`.

    Init runs on `device` so full-size builds take seconds on a GPU; the global RNG state is restored after.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown preset {preset!r}; expected one of {sorted(PRESETS)}")
    configs = PRESETS[preset]
    device = torch.device(device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        components = RandomComponents(
            transformer=StableAudioDiTModel.from_config(configs.transformer),
            vae=AutoencoderOobleck.from_config(configs.vae),
            projection_model=StableAudioProjectionModel.from_config(configs.projection_model),
            text_encoder=T5EncoderModel(T5Config(**configs.text_encoder)),
            tokenizer=build_tokenizer(),
        )
    for module in (components.transformer, components.vae, components.projection_model, components.text_encoder):
        module.eval().requires_grad_(False)
    return components


def write_checkpoint(directory: str | Path, preset: str, seed: int = 0) -> Path:
    """Writes a random `preset` build in the official stable-audio-open-1.0 layout under `directory`."""
    directory = Path(directory)
    components = build_random_components(preset, seed)
    components.transformer.save_pretrained(directory / "transformer")
    components.vae.save_pretrained(directory / "vae")
    components.projection_model.save_pretrained(directory / "projection_model")
    components.text_encoder.save_pretrained(directory / "text_encoder")
    components.tokenizer.save_pretrained(directory / "tokenizer")
    (directory / "scheduler").mkdir(parents=True, exist_ok=True)
    (directory / "scheduler" / "scheduler_config.json").write_text(json.dumps(SCHEDULER_CONFIG, indent=2))
    model_index = {
        "_class_name": "StableAudioPipeline",
        "projection_model": ["stable_audio", "StableAudioProjectionModel"],
        "scheduler": ["diffusers", "CosineDPMSolverMultistepScheduler"],
        "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "StableAudioDiTModel"],
        "vae": ["diffusers", "AutoencoderOobleck"],
    }
    (directory / "model_index.json").write_text(json.dumps(model_index, indent=2))
    return directory

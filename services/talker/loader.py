"""Builds the talker from an official checkpoint folder, the released shapes with random weights (`dummy`), or
the `tiny` preset. Checkpoint naming, config parsing and dtype choices live here, not in the modules."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from chorus.talker.checkpoint_config import config_to_json, parse_config
from chorus.talker.models.qwen3_layers import Qwen3BlockConfig
from chorus.talker.models.qwen3_tts_config import Qwen3TTSConfig, SpeakerEncoderConfig
from chorus.talker.models.qwen3_tts_talker import Qwen3TTSModel
from chorus.talker.sampling import SamplingParams
from chorus.talker.tokenizer import TalkerTokenizer, write_tiny_tokenizer

LANGUAGE_IDS = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
SPEAKER_IDS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
SPEAKER_DIALECTS = {name: False for name in SPEAKER_IDS} | {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}


def _released(model_size: str) -> Qwen3TTSConfig:
    width, intermediate = (1024, 3072) if model_size == "0b6" else (2048, 6144)
    return Qwen3TTSConfig(
        talker=Qwen3BlockConfig(width, intermediate, 28, 16, 8, 128, 1e6),
        code_predictor=Qwen3BlockConfig(1024, 3072, 5, 16, 8, 128, 1e6),
        model_type="custom_voice",
        model_size=model_size,
        language_ids=dict(LANGUAGE_IDS),
        speaker_ids=dict(SPEAKER_IDS),
        speaker_dialects=dict(SPEAKER_DIALECTS),
    )


RELEASED_CONFIGS = {"0.6b": _released("0b6"), "1.7b": _released("1b7")}
TINY_SEED = 20260
TINY_EOS_LOGIT_SCALE = 1.8
# Real id space (codec 3072 / 2048, 16 codebooks, text ids up to 151936), tiny widths. Type `base` with the
# CustomVoice speaker table so one tiny model serves every mode; size `1b7` so instructions are honoured.
TINY_CONFIG = Qwen3TTSConfig(
    talker=Qwen3BlockConfig(64, 128, 2, 4, 2, 16, 1e6),
    code_predictor=Qwen3BlockConfig(32, 64, 2, 4, 2, 16, 1e6),
    model_type="base",
    model_size="1b7",
    text_hidden_size=32,
    language_ids=dict(LANGUAGE_IDS),
    speaker_ids=dict(SPEAKER_IDS),
    speaker_dialects=dict(SPEAKER_DIALECTS),
    speaker_encoder=SpeakerEncoderConfig(
        enc_dim=64, enc_channels=(32, 32, 32, 32, 96), enc_attention_channels=16, enc_se_channels=16
    ),
)


class CheckpointError(ValueError):
    """A checkpoint folder that does not match the expected layout; the message lists the keys."""


@dataclasses.dataclass
class LoadedTalker:
    model: Qwen3TTSModel
    tokenizer: TalkerTokenizer
    sampling_defaults: SamplingParams
    max_new_tokens: int = 8192

    @property
    def config(self) -> Qwen3TTSConfig:
        return self.model.config


def randomize_(model: Qwen3TTSModel, seed: int) -> Qwen3TTSModel:
    """Overwrite every parameter (norm weights included) with seeded noise, in a fixed order.

    Norm weights get 1 + noise, everything else zero-mean noise scaled by 1/sqrt(fan-in), so activations stay
    O(1) at any width. Same seed, same config → identical weights in every process.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                values = 1.0 + 0.2 * noise
            elif "embedding" in name:
                values = noise
            elif param.ndim == 1:
                values = 0.1 * noise
            else:
                values = noise / param[0].numel() ** 0.5
            param.copy_(values.to(param.dtype))
    return model


def build_random(
    config: Qwen3TTSConfig,
    seed: int,
    device: str | torch.device = "cpu",
    dtype=torch.float32,
    eos_logit_scale: float = TINY_EOS_LOGIT_SCALE,
):
    """A `Qwen3TTSModel` of `config` with seeded random weights, on `device` in `dtype`.

    Random weights almost never pick codec EOS; scaling its `codec_head` row makes utterances end after a few
    seconds, so the tiny model exercises the stop path and its demos and tests stay short.
    """
    model = Qwen3TTSModel(config)
    randomize_(model, seed)
    with torch.no_grad():
        model.talker.codec_head.weight[config.codec_ids.eos] *= eos_logit_scale
    return model.to(device=device, dtype=dtype).eval()


def build_dummy(size: str, device: str | torch.device, dtype: torch.dtype, seed: int = 0) -> Qwen3TTSModel:
    """Released shapes (`0.6b` / `1.7b`) with random weights, initialised directly on `device`: compute cost does
    not depend on weight values, so this is what GPU benchmarks run."""
    if size not in RELEASED_CONFIGS:
        raise ValueError(f"size: unknown {size!r}; valid: {', '.join(RELEASED_CONFIGS)}")
    with torch.device(device):
        model = Qwen3TTSModel(RELEASED_CONFIGS[size]).to(dtype)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            scale = 0.02 if param.ndim > 1 else 0.0
            param.normal_(1.0 if name.endswith("norm.weight") else 0.0, scale, generator=generator)
    return model.eval()


def save_official(model: Qwen3TTSModel, folder: Path, sampling: SamplingParams | None = None) -> Path:
    """Write `model` as an official checkpoint folder (config, generation config, weights, tiny tokenizer)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config_to_json(model.config), indent=2))
    sampling = sampling or SamplingParams()
    generation = dataclasses.asdict(sampling) | {"max_new_tokens": 8192}
    generation["subtalker_dosample"] = generation.pop("subtalker_do_sample")
    generation.pop("seed")
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"))
    write_tiny_tokenizer(folder)
    return folder


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    index_path = folder / "model.safetensors.index.json"
    if index_path.exists():
        shards = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_file(str(folder / shard)))
        return weights
    single = folder / "model.safetensors"
    if not single.exists():
        raise CheckpointError(f"model: {folder} has neither model.safetensors nor model.safetensors.index.json")
    return load_file(str(single))


def load_checkpoint(folder: Path, device: str | torch.device = "cpu", dtype=torch.float32) -> LoadedTalker:
    """Load an official checkpoint folder as is; missing or unexpected keys raise `CheckpointError` listing them."""
    folder = Path(folder)
    config = parse_config(json.loads((folder / "config.json").read_text()))
    with torch.device("meta"):
        model = Qwen3TTSModel(config)
    weights = _read_weights(folder)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {folder} does not match a {config.model_type} {config.model_size} talker; "
            f"missing keys: {missing or 'none'}; unexpected keys: {unexpected or 'none'}"
        )
    model.load_state_dict({name: tensor.to(dtype) for name, tensor in weights.items()}, assign=True)
    generation_path = folder / "generation_config.json"
    generation = json.loads(generation_path.read_text()) if generation_path.exists() else {}
    tokenizer = TalkerTokenizer.from_dir(folder, config.text_ids.im_start, config.text_ids.im_end)
    return LoadedTalker(
        model.to(device).eval(),
        tokenizer,
        SamplingParams.from_generation_config(generation),
        int(generation.get("max_new_tokens", 8192)),
    )


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """`auto` device → cuda when available; `auto` dtype → bfloat16 on cuda, float32 on cpu."""
    resolved = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else device.replace("auto", "cpu"))
    if dtype == "auto":
        return resolved, torch.bfloat16 if resolved.type == "cuda" else torch.float32
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype: unknown {dtype!r}; valid: auto, bfloat16, float16, float32")
    return resolved, getattr(torch, dtype)


def build_talker(model: str, load_format: str, device: str | torch.device, dtype: torch.dtype, workdir: Path):
    """The service's entry: `tiny`, a released size with `load_format=dummy`, or a checkpoint folder."""
    if load_format == "dummy":
        size = model if model in RELEASED_CONFIGS else "0.6b"
        tokenizer_dir = workdir / "tiny-tokenizer"
        write_tiny_tokenizer(tokenizer_dir)
        config = RELEASED_CONFIGS[size]
        tokenizer = TalkerTokenizer.from_dir(tokenizer_dir, config.text_ids.im_start, config.text_ids.im_end)
        return LoadedTalker(build_dummy(size, device, dtype), tokenizer, SamplingParams())
    if model == "tiny":
        folder = workdir / "tiny-talker"
        if not (folder / "model.safetensors").exists():
            save_official(build_random(TINY_CONFIG, TINY_SEED), folder)
        return load_checkpoint(folder, device, dtype)
    return load_checkpoint(Path(model), device, dtype)

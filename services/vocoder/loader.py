"""Builds the codec from the official `speech_tokenizer/` folder, the released shapes with random weights
(`dummy`), or the `tiny` preset. Checkpoint naming and dtype choices live here, not in the modules."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from chorus.vocoder.models.codec_config import CodecConfig, CodecDecoderConfig
from chorus.vocoder.models.codec_decoder import CodecDecoder
from chorus.vocoder.models.codec_encoder import CodecEncoder

TINY_SEED = 1234
# Real id space and frame rate (16 codebooks × 2048, 1920 samples per frame, window 72), tiny widths.
TINY_CONFIG = CodecConfig(
    decoder=CodecDecoderConfig(
        codebook_dim=16,
        latent_dim=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=64,
        decoder_dim=32,
    ),
    encoder={
        "hidden_size": 32,
        "num_filters": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 8,
        "codebook_dim": 16,
        "vector_quantization_hidden_dimension": 16,
        "upsample_groups": 32,
    },
)
RELEASED_CONFIG = CodecConfig(decoder=CodecDecoderConfig(), encoder={})
# The official file also stores the quantizers' encode-side projections, which decoding never reads.
_UNUSED_DECODER_KEYS = frozenset({"quantizer.rvq_first.input_proj.weight", "quantizer.rvq_rest.input_proj.weight"})

_TRANSPOSED_CONV = re.compile(r"^(upsample\.\d+\.0|decoder\.\d+\.block\.1)\.conv\.weight$")

_RESIDUAL_BRANCH = re.compile(r"^decoder\.\d+\.block\.\d+\.conv2\.conv\.weight$")


class CheckpointError(ValueError):
    """A checkpoint folder that does not match the expected layout; the message lists the keys."""


@dataclasses.dataclass
class Codec:
    config: CodecConfig
    decoder: CodecDecoder
    encoder: CodecEncoder


def load_codec(
    model: str = "tiny",
    *,
    load_format: str = "auto",
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Codec:
    """Loads the codec decoder and encoder.

    `model`: `tiny` (seeded preset), `released` (only with `load_format="dummy"`), a `speech_tokenizer/` folder
    (or a checkpoint root holding one), or a hub id found in the local HF cache. `load_format="dummy"`: the
    folder's (or the released) shapes with seeded random weights. The decoder gets `dtype`; the encoder stays fp32.
    """
    if model == "tiny":
        codec = build_random_codec(TINY_CONFIG, TINY_SEED)
    elif model == "released" and load_format == "dummy":
        codec = build_random_codec(RELEASED_CONFIG, TINY_SEED)
    else:
        folder = _resolve_folder(model, needs_weights=load_format != "dummy")
        config = CodecConfig.from_official(json.loads((folder / "config.json").read_text()))
        codec = build_random_codec(config, TINY_SEED) if load_format == "dummy" else _load_folder(folder, config)
    # The encoder runs once per reference voice; fp32 keeps its codes identical to the reference's.
    codec.decoder.to(device=device, dtype=dtype).eval()
    codec.encoder.to(device=device).eval()
    return codec


def build_random_codec(config: CodecConfig, seed: int) -> Codec:
    """Seeded random weights: every process that builds the same config and seed gets the same codec."""
    generator = torch.Generator().manual_seed(seed)
    decoder = CodecDecoder(config.decoder)
    encoder = _new_encoder(config)
    with torch.no_grad():
        for name, tensor in [*decoder.state_dict(keep_vars=True).items(), *encoder.state_dict(keep_vars=True).items()]:
            _fill_random_(name, tensor, generator)
    return Codec(config, decoder, encoder)


def save_official(codec: Codec, folder: str | Path) -> Path:
    """Writes `config.json`, `preprocessor_config.json` and `model.safetensors` in the official layout."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(codec.config.to_official(), indent=2))
    preprocessor = {
        "feature_extractor_type": "EncodecFeatureExtractor",
        "feature_size": 1,
        "padding_side": "right",
        "padding_value": 0.0,
        "return_attention_mask": True,
        "sampling_rate": codec.config.input_sample_rate_hz,
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    tensors = {f"decoder.{k}": v for k, v in codec.decoder.state_dict().items() if k != "pre_transformer.inv_freq"}
    generator = torch.Generator().manual_seed(0)
    for key in sorted(_UNUSED_DECODER_KEYS):
        dim = codec.config.decoder.codebook_dim
        tensors[f"decoder.{key}"] = torch.randn(dim // 2, dim, 1, generator=generator)
    tensors.update({f"encoder.{k}": v for k, v in codec.encoder.mimi.state_dict().items()})
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


def _new_encoder(config: CodecConfig) -> CodecEncoder:
    return CodecEncoder(
        config.encoder, config.encoder_num_quantizers, config.decoder.samples_per_frame, config.input_sample_rate_hz
    )


def _resolve_folder(model: str, needs_weights: bool) -> Path:
    path = Path(model).expanduser()
    if not path.exists() and model.count("/") == 1 and not model.startswith((".", "/")):
        from huggingface_hub import snapshot_download

        try:
            path = Path(snapshot_download(model, local_files_only=True))
        except Exception as exc:
            raise CheckpointError(f"model {model!r}: not a folder and not in the local Hugging Face cache") from exc
    for candidate in (path / "speech_tokenizer", path):
        has_weights = (candidate / "model.safetensors").is_file() or not needs_weights
        if (candidate / "config.json").is_file() and has_weights:
            return candidate
    wanted = "config.json and model.safetensors" if needs_weights else "config.json"
    raise CheckpointError(f"model {model!r}: no speech_tokenizer/{wanted} under {path}")


def _load_folder(folder: Path, config: CodecConfig) -> Codec:
    tensors = load_file(folder / "model.safetensors")
    decoder = CodecDecoder(config.decoder)
    encoder = _new_encoder(config)
    unexpected = [k for k in tensors if not k.startswith(("decoder.", "encoder."))]
    for prefix, module in (("decoder.", decoder), ("encoder.", encoder.mimi)):
        part = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        for key in _UNUSED_DECODER_KEYS if prefix == "decoder." else ():
            part.pop(key, None)
        result = module.load_state_dict(part, strict=False)
        missing = [k for k in result.missing_keys if k != "pre_transformer.inv_freq"]
        if missing:
            raise CheckpointError(f"{folder / 'model.safetensors'}: missing keys {sorted(prefix + k for k in missing)}")
        unexpected += [prefix + k for k in result.unexpected_keys]
    if unexpected:
        raise CheckpointError(f"{folder / 'model.safetensors'}: unexpected keys {sorted(unexpected)}")
    return Codec(config, decoder, encoder)


def _fill_random_(name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
    """Noise of a scale that keeps activations O(1), so tests see real signal, not saturation or silence.

    The built-in inits would hide bugs (norms at 1, codebooks at 0, Snake at 0), so every value is drawn.
    """
    leaf = name.rsplit(".", 1)[-1]
    if not tensor.is_floating_point() or leaf in ("inv_freq", "initialized"):
        return
    noise = torch.randn(tensor.shape, generator=generator)
    if leaf == "cluster_usage":
        value = torch.rand(tensor.shape, generator=generator) * 1.5 + 0.5
    elif leaf in ("embedding_sum", "embed_sum"):
        value = noise
    elif leaf in ("alpha", "beta"):
        value = 0.3 * noise
    elif leaf in ("scale", "gamma"):
        value = 0.1 + 0.05 * noise
    elif tensor.dim() == 1:
        value = (1.0 if leaf == "weight" else 0.0) + 0.1 * noise
    else:
        # Transposed convs with kernel 2·stride sum two taps of every input channel per output sample.
        fan_in = 2 * tensor.shape[0] if _TRANSPOSED_CONV.match(name) else math.prod(tensor.shape[1:])
        # Unit-gain upsampling blocks would grow activations ~3× per block; large inputs to SnakeBeta's
        # sin(x·e^α) then amplify fp32 rounding far beyond what a trained decoder shows.
        gain = 1.0
        if _RESIDUAL_BRANCH.match(name):
            gain = 0.2
        elif _TRANSPOSED_CONV.match(name):
            gain = 0.7
        elif name.startswith("decoder.") and tensor.shape[0] == 1:
            gain = 0.3  # the waveform conv: a speech-like level, well inside the final clamp
        value = gain * noise / math.sqrt(fan_in)
    tensor.copy_(value.to(tensor.dtype))

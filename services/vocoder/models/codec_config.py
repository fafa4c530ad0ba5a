"""Shapes of the Qwen3-TTS 12 Hz codec decoder, read from `speech_tokenizer/config.json`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

# `Qwen3TTSTokenizerV2DecoderConfig.__init__` defaults: used for keys a config file leaves out.
_OFFICIAL_CLASS_DEFAULTS: dict[str, Any] = {
    "codebook_size": 2048,
    "hidden_size": 1024,
    "latent_dim": 1024,
    "rope_theta": 10000.0,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "sliding_window": 72,
    "intermediate_size": 3072,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "upsample_rates": (8, 5, 4, 3),
    "upsampling_ratios": (2, 2),
    "decoder_dim": 1536,
}


@dataclasses.dataclass(frozen=True, slots=True)
class CodecDecoderConfig:
    """The `decoder_config` block of the official tokenizer config (defaults: the released decoder)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    num_quantizers: int = 16
    latent_dim: int = 1024
    hidden_size: int = 512
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    intermediate_size: int = 1024
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    sliding_window: int = 72
    decoder_dim: int = 1536
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    output_sample_rate_hz: int = 24000

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.codebook_dim % 2:
            raise ValueError(f"codebook_dim must be even (split quantizer), got {self.codebook_dim}")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ValueError(f"decoder_dim {self.decoder_dim} must halve {len(self.upsample_rates)} times")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act must be silu, got {self.hidden_act!r}")

    @property
    def samples_per_frame(self) -> int:
        """Output samples per codec frame (1920 for the released decoder: 12.5 Hz at 24 kHz)."""
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    @property
    def num_context_frames(self) -> int:
        """Past frames a new frame's attention can see: the window includes the frame itself."""
        return self.sliding_window - 1

    @classmethod
    def from_official(cls, decoder_config: dict[str, Any], output_sample_rate_hz: int = 24000) -> CodecDecoderConfig:
        """Reads the official `decoder_config` dict. Absent keys take the official config class's defaults (not
        the released values), as the reference would; keys that do not shape the decoder are ignored."""
        if "codebook_dim" not in decoder_config:
            raise ValueError("decoder_config.codebook_dim is required")
        if decoder_config.get("attention_bias"):
            raise ValueError("decoder_config.attention_bias: biased attention projections are not supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        values = _OFFICIAL_CLASS_DEFAULTS | {k: v for k, v in decoder_config.items() if k in fields}
        for key in ("upsample_rates", "upsampling_ratios"):
            values[key] = tuple(values[key])
        values.setdefault("head_dim", values["hidden_size"] // values["num_attention_heads"])
        return cls(**values, output_sample_rate_hz=output_sample_rate_hz)

    def to_official(self) -> dict[str, Any]:
        """The `decoder_config` dict the official loader reads."""
        values = dataclasses.asdict(self)
        values.pop("output_sample_rate_hz")
        values["upsample_rates"] = list(self.upsample_rates)
        values["upsampling_ratios"] = list(self.upsampling_ratios)
        return values


@dataclasses.dataclass(frozen=True, slots=True)
class CodecConfig:
    """The whole 12 Hz tokenizer (`speech_tokenizer/config.json`): decoder shapes plus the Mimi encoder config."""

    decoder: CodecDecoderConfig
    encoder: dict[str, Any]
    encoder_num_quantizers: int = 16
    input_sample_rate_hz: int = 24000
    output_sample_rate_hz: int = 24000

    @classmethod
    def from_official(cls, config: dict[str, Any]) -> CodecConfig:
        model_type = config.get("model_type")
        if model_type != "qwen3_tts_tokenizer_12hz":
            raise ValueError(f"model_type must be qwen3_tts_tokenizer_12hz, got {model_type!r}")
        output_rate = int(config.get("output_sample_rate", 24000))
        decoder = CodecDecoderConfig.from_official(config.get("decoder_config") or {}, output_rate)
        if decoder.samples_per_frame != config.get("decode_upsample_rate", decoder.samples_per_frame):
            raise ValueError(
                f"decode_upsample_rate {config['decode_upsample_rate']} does not match the decoder's "
                f"upsampling ({decoder.samples_per_frame})"
            )
        return cls(
            decoder=decoder,
            encoder=dict(config.get("encoder_config") or {}),
            encoder_num_quantizers=int(config.get("encoder_valid_num_quantizers", 16)),
            input_sample_rate_hz=int(config.get("input_sample_rate", 24000)),
            output_sample_rate_hz=output_rate,
        )

    def to_official(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3TTSTokenizerV2Model"],
            "model_type": "qwen3_tts_tokenizer_12hz",
            "encoder_config": self.encoder,
            "decoder_config": self.decoder.to_official(),
            "encoder_valid_num_quantizers": self.encoder_num_quantizers,
            "input_sample_rate": self.input_sample_rate_hz,
            "output_sample_rate": self.output_sample_rate_hz,
            "decode_upsample_rate": self.decoder.samples_per_frame,
            "encode_downsample_rate": self.decoder.samples_per_frame,
        }

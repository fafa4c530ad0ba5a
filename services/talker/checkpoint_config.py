"""The official root `config.json` of a Qwen3-TTS-12Hz checkpoint ⇄ `Qwen3TTSConfig`."""

from __future__ import annotations

import dataclasses

from chorus.talker.models.qwen3_layers import Qwen3BlockConfig
from chorus.talker.models.qwen3_tts_config import CodecIds, Qwen3TTSConfig, SpeakerEncoderConfig, TextIds

# Required by the reference's attention; positions never differ across the three axes, so it is plain RoPE.
_ROPE_SCALING = {"mrope_section": [24, 20, 20], "interleaved": True, "rope_type": "default"}


def _block(section: dict) -> Qwen3BlockConfig:
    return Qwen3BlockConfig(
        hidden_size=section["hidden_size"],
        intermediate_size=section["intermediate_size"],
        num_hidden_layers=section["num_hidden_layers"],
        num_attention_heads=section["num_attention_heads"],
        num_key_value_heads=section["num_key_value_heads"],
        head_dim=section.get("head_dim", section["hidden_size"] // section["num_attention_heads"]),
        rope_theta=float(section.get("rope_theta", 10000.0)),
        rms_norm_eps=float(section.get("rms_norm_eps", 1e-6)),
    )


def parse_config(raw: dict) -> Qwen3TTSConfig:
    """The root `config.json` of an official checkpoint → `Qwen3TTSConfig`."""
    talker = raw["talker_config"]
    predictor = talker["code_predictor_config"]
    speaker_encoder = None
    if raw.get("tts_model_type") == "base":
        section = dict(raw.get("speaker_encoder_config") or {})
        section.setdefault("enc_dim", talker["hidden_size"])
        tuples = ("enc_channels", "enc_kernel_sizes", "enc_dilations")
        section = {key: tuple(value) if key in tuples else value for key, value in section.items()}
        section["sample_rate_hz"] = section.pop("sample_rate", 24000)
        speaker_encoder = SpeakerEncoderConfig(**section)
    return Qwen3TTSConfig(
        talker=_block(talker),
        code_predictor=_block(predictor),
        model_type=raw.get("tts_model_type", "custom_voice"),
        model_size=raw.get("tts_model_size", "1b7"),
        codec_vocab_size=talker["vocab_size"],
        code_vocab_size=predictor["vocab_size"],
        num_code_groups=talker["num_code_groups"],
        text_vocab_size=talker["text_vocab_size"],
        text_hidden_size=talker["text_hidden_size"],
        codec_ids=CodecIds(
            pad=talker["codec_pad_id"],
            bos=talker["codec_bos_id"],
            eos=talker["codec_eos_token_id"],
            think=talker["codec_think_id"],
            nothink=talker["codec_nothink_id"],
            think_bos=talker["codec_think_bos_id"],
            think_eos=talker["codec_think_eos_id"],
        ),
        text_ids=TextIds(
            im_start=raw.get("im_start_token_id", 151644),
            im_end=raw.get("im_end_token_id", 151645),
            tts_pad=raw.get("tts_pad_token_id", 151671),
            tts_bos=raw.get("tts_bos_token_id", 151672),
            tts_eos=raw.get("tts_eos_token_id", 151673),
        ),
        language_ids=dict(talker.get("codec_language_id") or {}),
        speaker_ids=dict(talker.get("spk_id") or {}),
        speaker_dialects=dict(talker.get("spk_is_dialect") or {}),
        speaker_encoder=speaker_encoder,
    )


def _block_json(block: Qwen3BlockConfig) -> dict:
    return {
        "hidden_size": block.hidden_size,
        "intermediate_size": block.intermediate_size,
        "num_hidden_layers": block.num_hidden_layers,
        "num_attention_heads": block.num_attention_heads,
        "num_key_value_heads": block.num_key_value_heads,
        "head_dim": block.head_dim,
        "rope_theta": block.rope_theta,
        "rms_norm_eps": block.rms_norm_eps,
        "hidden_act": "silu",
    }


def config_to_json(config: Qwen3TTSConfig) -> dict:
    """`Qwen3TTSConfig` → the official root `config.json` layout (inverse of `parse_config`)."""
    ids = config.codec_ids
    predictor = _block_json(config.code_predictor) | {
        "vocab_size": config.code_vocab_size,
        "num_code_groups": config.num_code_groups,
        "max_position_embeddings": 65536,
    }
    talker = _block_json(config.talker) | {
        "vocab_size": config.codec_vocab_size,
        "num_code_groups": config.num_code_groups,
        "text_vocab_size": config.text_vocab_size,
        "text_hidden_size": config.text_hidden_size,
        "max_position_embeddings": 32768,
        "rope_scaling": _ROPE_SCALING,
        "code_predictor_config": predictor,
        "codec_pad_id": ids.pad,
        "codec_bos_id": ids.bos,
        "codec_eos_token_id": ids.eos,
        "codec_think_id": ids.think,
        "codec_nothink_id": ids.nothink,
        "codec_think_bos_id": ids.think_bos,
        "codec_think_eos_id": ids.think_eos,
        "codec_language_id": config.language_ids,
        "spk_id": config.speaker_ids,
        "spk_is_dialect": config.speaker_dialects,
    }
    raw = {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tts_model_type": config.model_type,
        "tts_model_size": config.model_size,
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "talker_config": talker,
        "im_start_token_id": config.text_ids.im_start,
        "im_end_token_id": config.text_ids.im_end,
        "tts_pad_token_id": config.text_ids.tts_pad,
        "tts_bos_token_id": config.text_ids.tts_bos,
        "tts_eos_token_id": config.text_ids.tts_eos,
    }
    if config.speaker_encoder is not None:
        encoder = dataclasses.asdict(config.speaker_encoder)
        encoder["sample_rate"] = encoder.pop("sample_rate_hz")
        raw["speaker_encoder_config"] = {key: list(v) if isinstance(v, tuple) else v for key, v in encoder.items()}
    return raw

"""The codec loader: seeded presets identical across processes, released shapes, official config parsing."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
import torch

from chorus.vocoder.loader import CheckpointError, load_codec
from chorus.vocoder.models.codec_config import CodecConfig, CodecDecoderConfig

_DIGEST = """
import hashlib, torch
from chorus.vocoder.loader import load_codec
codec = load_codec("tiny")
digest = hashlib.sha256()
for module in (codec.decoder, codec.encoder):
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode()); digest.update(tensor.float().numpy().tobytes())
print(digest.hexdigest())
"""


def test_tiny_preset_is_identical_in_independent_processes():
    other = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, check=True).stdout
    local = hashlib.sha256()
    codec = load_codec("tiny")
    for module in (codec.decoder, codec.encoder):
        for name, tensor in sorted(module.state_dict().items()):
            local.update(name.encode())
            local.update(tensor.float().numpy().tobytes())
    assert other.strip() == local.hexdigest()


def test_released_dummy_has_the_released_shapes():
    decoder = load_codec("released", load_format="dummy").decoder
    shapes = {k: tuple(v.shape) for k, v in decoder.state_dict().items()}
    assert shapes["quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum"] == (2048, 256)
    assert shapes["pre_conv.conv.weight"] == (1024, 512, 3)
    assert shapes["pre_transformer.layers.7.self_attn.q_proj.weight"] == (1024, 512)
    assert shapes["upsample.1.0.conv.weight"] == (1024, 1024, 2)
    assert shapes["decoder.1.block.1.conv.weight"] == (1536, 768, 16)
    assert shapes["decoder.4.block.4.conv1.conv.weight"] == (96, 96, 7)
    assert shapes["decoder.6.conv.weight"] == (1, 96, 7)
    assert decoder.samples_per_frame == 1920
    with torch.inference_mode():
        waveform, state = decoder(torch.zeros(1, 2, 16, dtype=torch.int64), decoder.new_state(1))
    assert waveform.shape == (1, 3840) and state.num_frames.tolist() == [2]


# The released `speech_tokenizer/config.json` decoder block (3rd-party copies, see qwen3_tts_spec.md §4.1).
RELEASED_DECODER_CONFIG = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "latent_dim": 1024,
    "codebook_dim": 512,
    "codebook_size": 2048,
    "decoder_dim": 1536,
    "hidden_act": "silu",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "head_dim": 64,
    "num_attention_heads": 16,
    "num_hidden_layers": 8,
    "num_key_value_heads": 16,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000,
    "semantic_codebook_size": 4096,
    "sliding_window": 72,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "vector_quantization_hidden_dimension": 512,
}


def test_official_config_parsing():
    official = {
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "decode_upsample_rate": 1920,
        "encoder_config": {"hidden_size": 512},
        "decoder_config": RELEASED_DECODER_CONFIG,
    }
    config = CodecConfig.from_official(official)
    assert config.decoder == CodecDecoderConfig()
    assert CodecConfig.from_official(config.to_official()) == config
    with pytest.raises(ValueError, match="model_type"):
        CodecConfig.from_official({**official, "model_type": "qwen3_tts_tokenizer_25hz"})
    with pytest.raises(ValueError, match="decode_upsample_rate"):
        CodecConfig.from_official({**official, "decode_upsample_rate": 960})


def test_absent_decoder_keys_take_the_official_class_defaults():
    config = CodecDecoderConfig.from_official({"codebook_dim": 512})
    assert (config.hidden_size, config.intermediate_size, config.head_dim) == (1024, 3072, 64)
    with pytest.raises(ValueError, match=r"decoder_config\.codebook_dim"):
        CodecDecoderConfig.from_official({})
    with pytest.raises(ValueError, match=r"decoder_config\.attention_bias"):
        CodecDecoderConfig.from_official({"codebook_dim": 512, "attention_bias": True})


def test_unknown_model_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match=r"no speech_tokenizer/config\.json"):
        load_codec(str(tmp_path))


def test_dummy_reads_only_the_folder_config(tiny_folder, tmp_path):
    folder = tmp_path / "speech_tokenizer"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_folder / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_codec(str(tmp_path))
    dummy = load_codec(str(tmp_path), load_format="dummy")
    tiny = load_codec("tiny")
    assert dummy.config == tiny.config
    for name, tensor in tiny.decoder.state_dict().items():
        assert torch.equal(dummy.decoder.state_dict()[name], tensor), name

"""Checkpoint loading (single file, sharded, damaged), released shapes, config round trip, tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from chorus.talker.checkpoint_config import config_to_json, parse_config
from chorus.talker.loader import RELEASED_CONFIGS, TINY_CONFIG, CheckpointError, load_checkpoint
from chorus.talker.models.qwen3_tts_talker import Qwen3TTSModel
from chorus.talker.tokenizer import TalkerTokenizer


def test_config_round_trips_through_official_json():
    assert parse_config(json.loads(json.dumps(config_to_json(TINY_CONFIG)))) == TINY_CONFIG


def test_loaded_checkpoint_reproduces_every_weight(tiny_folder, tiny_loaded):
    saved = load_file(str(tiny_folder / "model.safetensors"))
    state = tiny_loaded.model.state_dict()
    assert set(saved) == set(state)
    assert all(torch.equal(saved[name], state[name]) for name in saved)
    assert tiny_loaded.sampling_defaults.repetition_penalty == 1.05


def test_sharded_checkpoint_loads(tiny_folder, tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_folder, folder)
    weights = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({name: weights[name] for name in shard_names}, str(folder / shard))
    index = {"weight_map": {name: shard for shard, shard_names in shards.items() for name in shard_names}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_checkpoint(folder)
    assert all(torch.equal(loaded.model.state_dict()[name], weights[name]) for name in names)


def test_missing_and_unexpected_keys_are_listed(tiny_folder, tmp_path):
    folder = tmp_path / "damaged"
    shutil.copytree(tiny_folder, folder)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["talker.model.layers.1.self_attn.q_norm.weight"]
    weights["talker.extra.weight"] = torch.zeros(2)
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(folder)
    assert "talker.model.layers.1.self_attn.q_norm.weight" in str(error.value)
    assert "talker.extra.weight" in str(error.value)


@pytest.mark.parametrize(("size", "talker_params_m", "has_projection"), [("0.6b", 440, False), ("1.7b", 1407, True)])
def test_released_shapes(size, talker_params_m, has_projection):
    with torch.device("meta"):
        model = Qwen3TTSModel(RELEASED_CONFIGS[size])
    state = model.state_dict()
    layers = sum(p.numel() for name, p in state.items() if name.startswith("talker.model.layers."))
    assert round(layers / 1e6) == pytest.approx(talker_params_m, abs=10)
    assert state["talker.model.text_embedding.weight"].shape == (151936, 2048)
    assert state["talker.model.layers.0.self_attn.q_proj.weight"].shape[0] == 16 * 128
    assert state["talker.code_predictor.lm_head.14.weight"].shape == (2048, 1024)
    assert ("talker.code_predictor.small_to_mtp_projection.weight" in state) == has_projection


def test_tokenizer_slices_the_template_like_the_reference(tiny_folder):
    tokenizer = TalkerTokenizer.from_dir(tiny_folder, 151644, 151645)
    role, text = tokenizer.encode_target("Hello world")
    assert role[0] == 151644 and len(role) == 3
    full = tokenizer.encode("<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>assistant\n")
    assert full == role + text + full[-5:] and full[-5] == 151645
    assert tokenizer._bpe.decode(text) == "Hello world"
    instruct = tokenizer.encode_instruct("Speak slowly")
    assert instruct[0] == 151644 and instruct[-2:] == [151645, role[2]]


def test_device_and_dtype_resolution():
    from chorus.talker.loader import resolve_device_dtype

    device, dtype = resolve_device_dtype("cpu", "auto")
    assert device.type == "cpu" and dtype is torch.float32
    assert resolve_device_dtype("cpu", "bfloat16")[1] is torch.bfloat16
    with pytest.raises(ValueError, match="dtype: unknown 'int8'"):
        resolve_device_dtype("cpu", "int8")

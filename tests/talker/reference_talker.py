"""Runs the official qwen-tts 0.1.1 talker on a checkpoint folder (executed by .venv-ref's Python).

Usage: reference_talker.py FOLDER CALLS_JSON TENSORS OUTPUTS. CALLS_JSON: a list of calls to
`Qwen3TTSForConditionalGeneration.generate`, each `{"name", "seed", "record_scores", "kwargs", "voice_clone"}`;
`voice_clone` names tensors in TENSORS (`ref_spk_embedding`, `ref_code`, None per row). OUTPUTS (safetensors):
`{name}.{row}` int64 codes (frames, 16); with `record_scores`, `{name}.scores0` (steps, B, 3072) and
`{name}.scores_cp` (frames * 15, B, 2048): every processed score tensor the logits processors returned; with a
`speaker_audio` tensor (24 kHz samples), `speaker_embedding` from `extract_speaker_embedding`.
"""

import json
import sys
from pathlib import Path

import torch
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
from safetensors.torch import load_file, save_file
from transformers.generation import logits_process

RECORDED: list[torch.Tensor] = []
_original_call = logits_process.LogitsProcessorList.__call__


def _recording_call(self, input_ids, scores, **kwargs):
    processed = _original_call(self, input_ids, scores, **kwargs)
    RECORDED.append(processed.detach().clone())
    return processed


def build_model(folder: str) -> Qwen3TTSForConditionalGeneration:
    raw = json.loads(Path(folder, "config.json").read_text())
    config = Qwen3TTSConfig(**raw)
    for sub in (config, config.talker_config, config.talker_config.code_predictor_config):
        sub._attn_implementation = "eager"
    model = Qwen3TTSForConditionalGeneration(config)
    model.load_state_dict(load_file(f"{folder}/model.safetensors"), strict=True)
    return model.eval()


def main(folder: str, calls_path: str, tensors_path: str, outputs_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    logits_process.LogitsProcessorList.__call__ = _recording_call
    model = build_model(folder)
    tensors = load_file(tensors_path)
    outputs = {}
    for call in json.loads(Path(calls_path).read_text()):
        kwargs = dict(call["kwargs"])
        kwargs["input_ids"] = [torch.tensor([ids]) for ids in kwargs["input_ids"]]
        for key in ("instruct_ids", "ref_ids"):
            if kwargs.get(key) is not None:
                kwargs[key] = [None if ids is None else torch.tensor([ids]) for ids in kwargs[key]]
        clone = call.get("voice_clone")
        if clone is not None:
            kwargs["voice_clone_prompt"] = {
                "ref_spk_embedding": [tensors[name] for name in clone["ref_spk_embedding"]],
                "ref_code": [None if name is None else tensors[name] for name in clone["ref_code"]],
                "x_vector_only_mode": clone["x_vector_only_mode"],
                "icl_mode": clone["icl_mode"],
            }
        torch.manual_seed(call.get("seed", 0))
        RECORDED.clear()
        codes, _ = model.generate(**kwargs)
        for row, row_codes in enumerate(codes):
            outputs[f"{call['name']}.{row}"] = row_codes.long().contiguous()
        if call.get("record_scores"):
            outputs[f"{call['name']}.scores0"] = torch.stack([s for s in RECORDED if s.shape[-1] != 2048]).float()
            outputs[f"{call['name']}.scores_cp"] = torch.stack([s for s in RECORDED if s.shape[-1] == 2048]).float()
    if "speaker_audio" in tensors:
        with torch.no_grad():
            embedding = model.extract_speaker_embedding(tensors["speaker_audio"].numpy(), 24000)
        outputs["speaker_embedding"] = embedding.float().contiguous()
    save_file(outputs, outputs_path)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Runs the official qwen-tts 0.1.1 12 Hz tokenizer on a checkpoint folder (executed by .venv-ref's Python).

Usage: reference_codec.py FOLDER INPUTS OUTPUTS. INPUTS (safetensors): `codes.*` int64 (frames, 16) decoded
one by one through `Qwen3TTSTokenizer.decode`; optional `batch` int64 (B, frames, 16) padded with -1;
optional `wav` float32 (samples,) at 24 kHz, encoded. OUTPUTS: `wav.*`, `batch.{i}`, `codes`.
"""

import sys

import torch
from qwen_tts import Qwen3TTSTokenizer
from safetensors.torch import load_file, save_file


def main(folder: str, inputs_path: str, outputs_path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    tokenizer = Qwen3TTSTokenizer.from_pretrained(folder, device_map="cpu", dtype=torch.float32)
    inputs = load_file(inputs_path)
    outputs = {}
    for name, codes in inputs.items():
        if name.startswith("codes."):
            wavs, _ = tokenizer.decode({"audio_codes": codes})
            outputs["wav." + name.removeprefix("codes.")] = torch.as_tensor(wavs[0]).float()
    if "batch" in inputs:
        wavs, _ = tokenizer.decode([{"audio_codes": row[row[:, 0] >= 0]} for row in inputs["batch"]])
        outputs.update({f"batch.{i}": torch.as_tensor(w).float() for i, w in enumerate(wavs)})
    if "wav" in inputs:
        encoded = tokenizer.encode(inputs["wav"].numpy(), sr=24000)
        outputs["codes"] = encoded.audio_codes[0].long()
    save_file({k: v.contiguous() for k, v in outputs.items()}, outputs_path)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Writes a random-weight Qwen3-TTS-12Hz Base checkpoint in the official layout, for side-by-side peer runs.

Usage: python bench/peers/write_checkpoint.py OUT [--size tiny|0.6b|1.7b] [--dtype bfloat16|float32]
                                              [--type base|custom_voice]

OUT gets what the released `Qwen3-TTS-12Hz-*-Base` folders hold and what both the peers (qwen-tts's
`Qwen3TTSModel.from_pretrained`) and Chorus (`load_checkpoint`, `load_codec`) read: `config.json`,
`generation_config.json`, `model.safetensors`, `vocab.json` + `merges.txt` + `tokenizer_config.json`, and
`speech_tokenizer/` (codec `config.json`, `preprocessor_config.json`, `model.safetensors`). The writing itself
is Chorus's own loaders' `save_official`, the code the parity tests use; this file only picks shapes and adds
the tokenizer metadata that transformers' `AutoProcessor` needs.

The type is `base` (voice clone) by default because faster-qwen3-tts-batch only batches voice-clone requests;
one checkpoint then serves both peers and Chorus. `custom_voice` writes the same talker and codec shapes with
the released speaker table instead of the speaker encoder, for benches that ask for a named voice. Compute cost
does not depend on weight values, so random weights time the same as the released ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from chorus.talker.loader import RELEASED_CONFIGS, TINY_CONFIG, TINY_SEED, build_random
from chorus.talker.loader import save_official as save_talker
from chorus.talker.models.qwen3_tts_config import Qwen3TTSConfig, SpeakerEncoderConfig
from chorus.vocoder import loader as codec_loader

# Text-side special tokens the peers' prompt templates contain, at their released ids.
SPECIAL_TOKENS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>"}


def base_config(size: str) -> Qwen3TTSConfig:
    """The released Base model of `size`: no speaker table, an ECAPA speaker encoder as wide as the talker."""
    if size == "tiny":
        return TINY_CONFIG
    released = RELEASED_CONFIGS[size]  # the CustomVoice model of that size
    encoder = SpeakerEncoderConfig(enc_dim=released.talker.hidden_size)
    return dataclasses.replace(
        released, model_type="base", speaker_ids={}, speaker_dialects={}, speaker_encoder=encoder
    )


def add_tokenizer_metadata(folder: Path) -> None:
    """Make Chorus's tiny BPE loadable by `AutoProcessor` with the special tokens at their real ids.

    transformers numbers added tokens after the vocabulary (ids ~500 for this tiny BPE), so the special tokens
    also go into `vocab.json` at their released ids; `added_tokens_decoder` then maps onto those entries.
    """
    vocab_path = folder / "vocab.json"
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    vocab.update({content: token_id for token_id, content in SPECIAL_TOKENS.items()})
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    added = {
        str(token_id): {
            "content": content,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for token_id, content in SPECIAL_TOKENS.items()
    }
    tokenizer_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "processor_class": "Qwen3TTSProcessor",
        "model_max_length": 131072,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "added_tokens_decoder": added,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")


def write_checkpoint(
    out: Path, size: str = "tiny", dtype: torch.dtype = torch.float32, model_type: str = "base", seed: int = TINY_SEED
) -> Path:
    """Write the talker, tokenizer and `speech_tokenizer/` of `size` with seeded random weights under `out`."""
    if model_type == "custom_voice" and size == "tiny":
        raise ValueError("the tiny preset is a base model with the speaker table; use it for both types")
    config = RELEASED_CONFIGS[size] if model_type == "custom_voice" else base_config(size)
    talker = build_random(config, seed, dtype=dtype)
    save_talker(talker, out)
    del talker
    add_tokenizer_metadata(out)
    codec_config = codec_loader.TINY_CONFIG if size == "tiny" else codec_loader.RELEASED_CONFIG
    # The codec stays float32, as released: its decoder is small and the peers cast it themselves.
    codec_loader.save_official(codec_loader.build_random_codec(codec_config, seed), out / "speech_tokenizer")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", choices=["tiny", *RELEASED_CONFIGS], default="tiny")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--type", choices=["base", "custom_voice"], default="base")
    args = parser.parse_args()
    folder = write_checkpoint(args.out, args.size, getattr(torch, args.dtype), args.type)
    total_mib = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20
    print(f"wrote {args.size} {args.type} checkpoint to {folder} ({total_mib:.0f} MiB)")


if __name__ == "__main__":
    main()

"""Qwen2 byte-level BPE from a checkpoint's `vocab.json` + `merges.txt`, built with `tokenizers` (no transformers).

Special tokens (`<|im_start|>` …) are split off before BPE and mapped to their fixed ids, as the reference's
added tokens are. Target text is tokenized inside the reference's full template and sliced the same way, so text
that starts with a newline merges into the role token exactly as it does there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer

_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TARGET_TEMPLATE = IM_START + "assistant\n{text}" + IM_END + "\n" + IM_START + "assistant\n"
REF_TEMPLATE = IM_START + "assistant\n{text}" + IM_END + "\n"
INSTRUCT_TEMPLATE = IM_START + "user\n{text}" + IM_END + "\n"


def _pipeline(bpe: BPE) -> Tokenizer:
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


class TalkerTokenizer:
    def __init__(self, bpe_tokenizer: Tokenizer, special_ids: dict[str, int]) -> None:
        self._bpe = bpe_tokenizer
        self.special_ids = dict(special_ids)
        names = sorted(self.special_ids, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(re.escape(name) for name in names) + ")")

    @classmethod
    def from_dir(cls, folder: Path, im_start_id: int, im_end_id: int) -> TalkerTokenizer:
        """`folder/vocab.json` + `merges.txt`; special ids from `tokenizer_config.json` when present."""
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        merges = []
        for line in (folder / "merges.txt").read_text(encoding="utf-8").splitlines():
            if line and not line.startswith("#version"):
                left, right = line.split(" ")
                merges.append((left, right))
        special = {IM_START: im_start_id, IM_END: im_end_id}
        config_path = folder / "tokenizer_config.json"
        if config_path.exists():
            added = json.loads(config_path.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
            special.update({entry["content"]: int(token_id) for token_id, entry in added.items()})
        bpe = BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
        return cls(_pipeline(bpe), special)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._special_split.split(text):
            if piece in self.special_ids:
                ids.append(self.special_ids[piece])
            elif piece:
                ids.extend(self._bpe.encode(piece, add_special_tokens=False).ids)
        return ids

    def encode_target(self, text: str) -> tuple[list[int], list[int]]:
        """(role ids `<|im_start|> assistant \\n`, target text ids) exactly as the reference slices them."""
        ids = self.encode(TARGET_TEMPLATE.format(text=text))
        return ids[:3], ids[3:-5]

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of a later piece of streamed text (tokenized on its own: BPE merges do not cross pieces)."""
        return self.encode(text)

    def encode_ref_text(self, text: str) -> list[int]:
        return self.encode(REF_TEMPLATE.format(text=text))[3:-2]

    def encode_instruct(self, text: str) -> list[int]:
        return self.encode(INSTRUCT_TEMPLATE.format(text=text))


_TINY_CORPUS = [
    "Hello, world! This is a tiny tokenizer for the Chorus talker tests.",
    "The quick brown fox jumps over the lazy dog. Speak slowly and clearly, please.",
    "Streaming text arrives piece by piece; the talker waits for it.",
    "Numbers like 12.5 Hz, 24000 samples and 1920 samples per frame.",
    # The role words must end up as single tokens, as they are in the real vocabulary.
    *["assistant\nuser\n"] * 64,
]


def write_tiny_tokenizer(folder: Path, vocab_size: int = 512) -> None:
    """Write a small byte-level BPE (`vocab.json`, `merges.txt`) trained offline on a fixed corpus.

    Ids stay far below the special ids, which keep their real values (151644 …).
    """
    trainer = BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer = _pipeline(BPE(unk_token=None))
    tokenizer.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")

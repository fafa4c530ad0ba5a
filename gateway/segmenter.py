"""Splitting long input into segments at sentence boundaries, for concurrent synthesis.

Contract: `"".join(split_segments(text, n)) == text` (every character kept, whitespace included,
so a segment's trailing space travels with it) and every segment has at most `n` characters.
Sentences are packed greedily, so segments are as long as the limit allows. A sentence longer
than the limit is cut at the last clause boundary (comma, semicolon, CJK comma…), else at the
last space, else hard at the limit (e.g. unpunctuated CJK).
"""

from __future__ import annotations

import re

# A sentence ends after . ! ? … (followed by space or the end, so "3.14" and "e.g.x" stay whole),
# after CJK full stops (no space follows those), or at a line break. Closing quotes and brackets
# and the whitespace after the terminator stay with the sentence.
_SENTENCE_END = re.compile(
    r"""(?:[.!?…]+["'”’»)\]]*(?:\s+|$)|[。！？；]+["'”’」』）\]]*\s*|\n\s*)""",
)
_CLAUSE_END = re.compile(r"""[,;:，、；：]["'”’」』）)]*\s*""")
_SPACE = re.compile(r"\s+")


def _sentences(text: str) -> list[str]:
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if match.end() > start:
            sentences.append(text[start : match.end()])
            start = match.end()
    if start < len(text):
        sentences.append(text[start:])
    return sentences


def _cut(piece: str, max_chars: int) -> list[str]:
    """Cuts one over-long sentence into parts of at most `max_chars`."""
    parts = []
    while len(piece) > max_chars:
        window = piece[:max_chars]
        cut = 0
        for pattern in (_CLAUSE_END, _SPACE):
            ends = [m.end() for m in pattern.finditer(window) if m.end() < len(piece)]
            if ends:
                cut = ends[-1]
                break
        cut = cut or max_chars
        parts.append(piece[:cut])
        piece = piece[cut:]
    if piece:
        parts.append(piece)
    return parts


def split_segments(text: str, max_chars: int) -> list[str]:
    """`text` as consecutive segments of at most `max_chars`, split at sentence boundaries."""
    if max_chars < 1:
        raise ValueError(f"max_chars: must be at least 1, got {max_chars}")
    segments: list[str] = []
    current = ""
    for sentence in _sentences(text):
        for piece in _cut(sentence, max_chars):
            if current and len(current) + len(piece) > max_chars:
                segments.append(current)
                current = ""
            current += piece
    if current:
        segments.append(current)
    return segments

"""Dependency-free PNG bar charts for benchmark commands (the GPU image has no plotting library here)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

OURS_COLOR, REFERENCE_COLOR = (40, 90, 200), (150, 150, 150)
# Tableau's ten, for the parts of a stacked bar: the JSON next to the plot names them in this order.
STACK_COLORS = (
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
)  # fmt: skip


def write_grouped_bars(path: Path, pairs: list[tuple[float, float]]) -> None:
    """One group per setting: ours (blue) beside the reference (grey), scaled to the largest value."""
    height, bar_width, gap = 240, 30, 24
    width = gap + len(pairs) * (2 * bar_width + gap)
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    top = max(max(pair) for pair in pairs) or 1.0
    for group, pair in enumerate(pairs):
        for index, (value, color) in enumerate(zip(pair, (OURS_COLOR, REFERENCE_COLOR), strict=True)):
            left = gap + group * (2 * bar_width + gap) + index * bar_width
            bar_height = int((height - 20) * value / top)
            image[height - 10 - bar_height : height - 10, left : left + bar_width - 2] = color
    _write_png(path, image)


def write_stacked_bars(path: Path, stacks: list[list[float]]) -> None:
    """One bar per stack, its parts bottom-up in STACK_COLORS order (cycled), scaled to the tallest bar."""
    height, bar_width, gap = 240, 40, 24
    width = gap + len(stacks) * (bar_width + gap)
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    top = max((sum(stack) for stack in stacks), default=0.0) or 1.0
    for index, stack in enumerate(stacks):
        left, bottom = gap + index * (bar_width + gap), height - 10
        for part, value in enumerate(stack):
            part_height = round((height - 20) * value / top)
            image[bottom - part_height : bottom, left : left + bar_width] = STACK_COLORS[part % len(STACK_COLORS)]
            bottom -= part_height
    _write_png(path, image)


def _write_png(path: Path, image: np.ndarray) -> None:
    height, width, _ = image.shape
    raw = b"".join(b"\x00" + row.tobytes() for row in image)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )

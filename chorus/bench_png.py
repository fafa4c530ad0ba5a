"""A dependency-free PNG bar chart for benchmark commands (the GPU image has no plotting library here)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

OURS_COLOR, REFERENCE_COLOR = (40, 90, 200), (150, 150, 150)


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
    raw = b"".join(b"\x00" + row.tobytes() for row in image)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )

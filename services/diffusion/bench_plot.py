"""A dependency-free PNG bar chart for the benchmark: groups of coloured bars, each labelled with its value.

Only what the benchmark needs: bars scaled to the largest value, a value label in seconds above each bar
(a 3×5 pixel font of digits, '.' and 's'), groups separated by gaps. Legends live in the JSON next to it.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

_GLYPHS = {
    "0": ("111", "101", "101", "101", "111"),
    "1": ("010", "110", "010", "010", "111"),
    "2": ("111", "001", "111", "100", "111"),
    "3": ("111", "001", "111", "001", "111"),
    "4": ("101", "101", "111", "001", "001"),
    "5": ("111", "100", "111", "001", "111"),
    "6": ("111", "100", "111", "101", "111"),
    "7": ("111", "001", "001", "001", "001"),
    "8": ("111", "101", "111", "101", "111"),
    "9": ("111", "101", "111", "001", "111"),
    ".": ("000", "000", "000", "000", "010"),
    "s": ("000", "011", "110", "011", "110"),
}
COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40))
_WHITE = (255, 255, 255)
_BLACK = (0, 0, 0)


def write_bar_chart(path: Path, groups: list[list[tuple[float, int]]], height_px: int = 300) -> None:
    """groups: per group, (value in seconds, colour index into COLORS) for each bar."""
    bar_px, gap_px, margin_px, font_scale = 44, 48, 24, 2
    num_bars = sum(len(group) for group in groups)
    width_px = 2 * margin_px + num_bars * (bar_px + 4) + (len(groups) - 1) * gap_px
    top_px = margin_px + 8 * font_scale
    pixels = [[_WHITE] * width_px for _ in range(height_px)]
    largest = max((value for group in groups for value, _ in group), default=1.0) or 1.0
    x = margin_px
    for group in groups:
        for value, color in group:
            bar_height = round((height_px - top_px - margin_px) * value / largest)
            for row in range(height_px - margin_px - bar_height, height_px - margin_px):
                pixels[row][x : x + bar_px] = [COLORS[color % len(COLORS)]] * bar_px
            label = f"{value:.2f}s" if value < 10 else f"{value:.1f}s"
            _draw_text(pixels, label, x, height_px - margin_px - bar_height - 7 * font_scale, font_scale)
            x += bar_px + 4
        x += gap_px
    for column in range(margin_px // 2, width_px - margin_px // 2):
        pixels[height_px - margin_px][column] = _BLACK
    _write_png(path, pixels)


def _draw_text(pixels: list[list[tuple[int, int, int]]], text: str, x: int, y: int, scale: int) -> None:
    for glyph_index, char in enumerate(text):
        for glyph_row, bits in enumerate(_GLYPHS[char]):
            for glyph_column, bit in enumerate(bits):
                if bit != "1":
                    continue
                for dy in range(scale):
                    for dx in range(scale):
                        row = y + glyph_row * scale + dy
                        column = x + (glyph_index * 4 + glyph_column) * scale + dx
                        if 0 <= row < len(pixels) and 0 <= column < len(pixels[0]):
                            pixels[row][column] = _BLACK


def _write_png(path: Path, pixels: list[list[tuple[int, int, int]]]) -> None:
    height_px, width_px = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width_px, height_px, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )

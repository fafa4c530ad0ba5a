"""Bucket sizes for captured CUDA graphs: a batch runs the graph of the smallest size that holds it."""

from __future__ import annotations


def power_of_two_sizes(largest: int) -> tuple[int, ...]:
    """Powers of two below `largest`, then `largest` itself: 1, 2, 4, … (at most twice the rows a batch needs)."""
    return tuple(sorted({1 << i for i in range(largest.bit_length()) if 1 << i < largest} | {largest}))

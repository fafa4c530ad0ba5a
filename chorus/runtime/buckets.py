"""Bucket sizes for captured CUDA graphs: a batch runs the graph of the smallest size that holds it."""

from __future__ import annotations


def power_of_two_sizes(largest: int) -> tuple[int, ...]:
    """Powers of two below `largest`, then `largest` itself: 1, 2, 4, … (at most twice the rows a batch needs)."""
    return tuple(sorted({1 << i for i in range(largest.bit_length()) if 1 << i < largest} | {largest}))


def power_of_two_and_midpoint_sizes(largest: int) -> tuple[int, ...]:
    """Powers of two and the sizes halfway between them (3 · 2^k) below `largest`, then `largest` itself: 1, 2, 3,
    4, 6, 8, 12, … (at most a third more rows than a batch needs, where powers of two alone compute up to twice)."""
    powers = power_of_two_sizes(largest)
    return tuple(sorted({*powers, *(3 << i for i in range(largest.bit_length()) if 3 << i < largest)}))

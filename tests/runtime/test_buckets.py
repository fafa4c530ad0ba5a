"""Graph bucket sizes: every batch up to the largest has a bucket, and how much bigger that bucket may be."""

from __future__ import annotations

import pytest

from chorus.runtime.buckets import power_of_two_and_midpoint_sizes, power_of_two_sizes


def test_power_of_two_and_midpoint_sizes():
    assert power_of_two_and_midpoint_sizes(64) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    assert power_of_two_and_midpoint_sizes(100)[-3:] == (64, 96, 100)
    assert power_of_two_and_midpoint_sizes(1) == (1,)


@pytest.mark.parametrize(
    ("sizes", "most_rows_per_row"), [(power_of_two_sizes, 2.0), (power_of_two_and_midpoint_sizes, 1.5)]
)
def test_the_bucket_of_a_batch_holds_it_with_a_bounded_excess(sizes, most_rows_per_row):
    buckets = sizes(64)
    for batch in range(1, 65):
        bucket = next(size for size in buckets if size >= batch)
        assert bucket < most_rows_per_row * batch or bucket == batch

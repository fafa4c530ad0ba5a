"""Clip-sized buffers stay mapped between uses once `keep_large_buffers_mapped` set the malloc thresholds."""

from __future__ import annotations

import platform
import resource

import pytest

from chorus.runtime.heap import keep_large_buffers_mapped

CLIP_BYTES = 3_528_000  # 10 s of 44.1 kHz stereo float32


def _copy_a_clip_four_times() -> None:
    """As the diffusion service does on the way out: bytes, protobuf field, serialized message, gRPC slice."""
    copies = [b"\x01" * CLIP_BYTES]
    for _ in range(3):
        copies.append(bytes(memoryview(copies[-1])))


def _page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_copies_of_a_clip_reuse_mapped_pages():
    assert keep_large_buffers_mapped()
    _copy_a_clip_four_times()  # the heap grows to hold them once
    faults_before = _page_faults()
    for _ in range(10):
        _copy_a_clip_four_times()
    # With glibc's default thresholds: ~3500 faults per clip (the heap is trimmed once its copies are freed).
    assert _page_faults() - faults_before < 500

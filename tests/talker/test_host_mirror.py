"""A host mirror uploads its table's values as they were at each upload, in stream order, and on CUDA never waits
for the stream: uploads faster than the stream runs each get a staging buffer of their own."""

from __future__ import annotations

import pytest
import torch

from chorus.talker.engine.host_mirror import HostMirror


def _uploads_in_order(device: str) -> tuple[list[torch.Tensor], bool]:
    """Three uploads of a table, each followed by a copy of the device table, enqueued behind a busy stream on
    CUDA; returns the copies and whether the stream was still busy after the last upload."""
    table = torch.zeros(4, 3, dtype=torch.long, device=device)
    mirror = HostMirror(table)
    if device == "cuda":
        torch.cuda._sleep(200_000_000)  # ~0.1 s of a busy stream ahead of the uploads
    seen = []
    for value in (1, 2, 3):
        mirror.host[:] = value
        mirror.host[3] = -value
        mirror.mark_changed()
        mirror.upload(num_rows=3 if value == 3 else None)  # the last upload leaves row 3 as it was
        seen.append(table.clone())
    still_busy = device == "cuda" and not torch.cuda.current_stream().query()
    return [copy.cpu() for copy in seen], still_busy


def _expected(value: int, last_row: int) -> torch.Tensor:
    expected = torch.full((4, 3), value, dtype=torch.long)
    expected[3] = last_row
    return expected


def test_each_upload_lands_as_its_values_were():
    seen, _ = _uploads_in_order("cpu")
    assert [s.tolist() for s in seen] == [
        _expected(1, -1).tolist(),
        _expected(2, -2).tolist(),
        _expected(3, -2).tolist(),
    ]


@pytest.mark.gpu
def test_uploads_behind_a_busy_stream_do_not_wait_and_land_in_order():
    seen, still_busy = _uploads_in_order("cuda")
    assert still_busy, "an upload waited for the stream"
    assert [s.tolist() for s in seen] == [
        _expected(1, -1).tolist(),
        _expected(2, -2).tolist(),
        _expected(3, -2).tolist(),
    ]

"""A small device table written on the host and uploaded whole, in one copy, when the engine next needs it.

The engine thread edits tables such as the KV block table and the per-slot sampling parameters a few entries at a
time (a request prefilled, grown by a block, finished). Writing each edit to the device is a PyTorch call and a
copy apiece; on a serving process every such call hands the GIL away and waits to get it back, so edits made
many times a step cost more host time than the step's launch. Here edits go to a NumPy array, and `upload`
copies the whole table, when it changed, through a pinned staging buffer: one copy, enqueued on the stream like
every launch (work already launched still sees the old values), never waiting for the stream.
"""

from __future__ import annotations

import numpy as np
import torch


class HostMirror:
    def __init__(self, device_table: torch.Tensor) -> None:
        """`device_table`: the table the device reads; its current values become the host's."""
        self.device_table = device_table
        self.host = device_table.cpu().numpy().copy()  # edit this, then `mark_changed`
        self._changed = False
        self._on_cuda = device_table.device.type == "cuda"
        # Pinned staging buffers, each with the event of the last copy from it, reused only once that copy ran:
        # filling one while the stream still copies from it would upload the new values early. A table uploaded
        # more often than steps complete (one prefill batch after another in a step) gets another buffer rather
        # than waiting for the stream.
        self._staging: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []

    def mark_changed(self) -> None:
        self._changed = True

    def upload(self, num_rows: int | None = None) -> None:
        """The host values to the device table, if they changed since the last upload; only its first `num_rows`
        rows when given (a table whose user filled no more)."""
        if not self._changed:
            return
        self._changed = False
        staging, copied = self._free_staging()
        target, host = self.device_table, self.host
        if num_rows is not None:  # views only then: each is a PyTorch call, and a whole table is uploaded every step
            target, staging, host = target[:num_rows], staging[:num_rows], host[:num_rows]
        np.copyto(staging.numpy(), host)
        target.copy_(staging, non_blocking=True)
        if copied is not None:
            copied.record()

    def _free_staging(self) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """A staging buffer no copy still reads (on the CPU every copy is done when it returns)."""
        for staging, copied in self._staging:
            if copied is None or copied.query():
                return staging, copied
        staging = torch.empty_like(self.device_table, device="cpu", pin_memory=self._on_cuda)
        self._staging.append((staging, torch.cuda.Event() if self._on_cuda else None))
        return self._staging[-1]

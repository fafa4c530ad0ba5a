"""A batching window: requests that arrive close together are released to a backend together.

The first request opens a window; the window closes when `window_s` has passed or
`max_batch_size` requests have joined, whichever is first, and every member is released at
once, so the diffusion service's scheduler sees them as one batch instead of trickling in. A
member cancelled while it waits leaves the window and does not count towards its size.
"""

from __future__ import annotations

import asyncio


class _Window:
    def __init__(self) -> None:
        self.members: list[asyncio.Future] = []
        self.timer: asyncio.TimerHandle | None = None


class BatchWindow:
    def __init__(self, window_s: float, max_batch_size: int) -> None:
        if window_s < 0:
            raise ValueError(f"window_s: must not be negative, got {window_s}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: must be at least 1, got {max_batch_size}")
        self.window_s = window_s
        self.max_batch_size = max_batch_size
        self._open: _Window | None = None

    async def join(self) -> int:
        """Waits for the current window to close; returns the size of the batch released with it."""
        if self._open is None:
            self._open = _Window()
            self._open.timer = asyncio.get_running_loop().call_later(self.window_s, self._close, self._open)
        window = self._open
        member = asyncio.get_running_loop().create_future()
        window.members.append(member)
        if len(window.members) >= self.max_batch_size:
            self._close(window)
        try:
            return await member
        except asyncio.CancelledError:
            if window is self._open:
                window.members.remove(member)
            raise

    def _close(self, window: _Window) -> None:
        if window is not self._open:
            return  # already closed by size
        self._open = None
        if window.timer is not None:
            window.timer.cancel()
        released = [member for member in window.members if not member.done()]
        for member in released:
            member.set_result(len(released))

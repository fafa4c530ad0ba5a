"""Child-process helpers for `chorus up`: free ports, and children that die with their parent."""

from __future__ import annotations

import ctypes
import signal
import socket
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM this child if its parent dies, so a killed `chorus up` leaves no orphans."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)

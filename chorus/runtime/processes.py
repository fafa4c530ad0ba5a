"""Child-process helpers for `chorus up`: free ports, and children that die with their parent."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import sys


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago. They are held open together while the OS picks them:
    picked one at a time, a port just released can come back (it once gave a stack's talker the gateway's REST
    port, and both bound it with SO_REUSEPORT)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM this child if its parent dies, so a killed `chorus up` leaves no orphans."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)

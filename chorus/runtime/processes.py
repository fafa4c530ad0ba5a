"""Child-process helpers for `chorus up`: free ports, and children that die with their parent."""

from __future__ import annotations

import contextlib
import ctypes
import random
import signal
import socket
import sys

# Where the kernel picks the local ports of outgoing connections and of binds to port 0. A port picked there for a
# child to bind later can be taken meanwhile by any process's connection or port-0 bind (a test cluster's diffusion
# replica once found its port in use when it came to bind it); one below it only by an explicit bind.
EPHEMERAL_PORTS_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PICKED_PORT = 10000
PICK_ATTEMPTS = 200


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, outside the ephemeral range where possible."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago, below the kernel's ephemeral range where it leaves room
    (else where the OS picks). They are held open together while picked: picked one at a time, a port just released
    can come back (it once gave a stack's talker the gateway's REST port, and both bound it with SO_REUSEPORT)."""
    first_ephemeral = _first_ephemeral_port()
    candidates = random.sample(range(LOWEST_PICKED_PORT, first_ephemeral), PICK_ATTEMPTS) if first_ephemeral else []
    with contextlib.ExitStack() as held:
        ports = []
        for candidate in [*candidates, *[0] * count]:  # then the OS's picks, should too few of them be free
            if len(ports) == count:
                break
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind((host, candidate))
            except OSError:
                continue
            ports.append(sock.getsockname()[1])
        return ports


def _first_ephemeral_port() -> int | None:
    """The ephemeral range's first port, when it leaves room below it to pick from (Linux); else None."""
    try:
        with open(EPHEMERAL_PORTS_FILE) as file:
            first = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return first if first - LOWEST_PICKED_PORT >= PICK_ATTEMPTS else None


def die_with_parent() -> None:
    """preexec_fn: ask Linux to SIGTERM this child if its parent dies, so a killed `chorus up` leaves no orphans."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)

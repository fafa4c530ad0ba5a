"""The processes of a stack running on this machine, read from /proc (Linux only): who listens on which TCP
port, and how much CPU a process has used. The bench runs beside the stack: `--chaos` kills replicas by their
port, and the step-time breakdown finds the processes whose metrics and CPU it reads."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
from pathlib import Path

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Listener:
    port: int
    host: str  # where to connect: the bound address, or loopback for a wildcard bind
    pid: int


def listeners() -> list[Listener]:
    """Every TCP socket in LISTEN state on this machine with the process holding it (one row per process when
    several share a port with SO_REUSEPORT); processes this user may not inspect are left out."""
    sockets: dict[int, tuple[int, str]] = {}  # inode → (port, host)
    for table, wildcard, loopback in (("/proc/net/tcp", "0.0.0.0", "127.0.0.1"), ("/proc/net/tcp6", "::", "::1")):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].rsplit(":", 1)
            host = _address(address)
            sockets[int(fields[9])] = (int(port, 16), loopback if host == wildcard else host)
    found = []
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            links = [_link(fd) for fd in (process / "fd").iterdir()]
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        inodes = {int(link[8:-1]) for link in links if link.startswith("socket:[")}
        found += [Listener(*sockets[inode], int(process.name)) for inode in inodes & sockets.keys()]
    return found


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except FileNotFoundError:  # closed since the listing (the listing's own descriptor, for one)
        return ""


def _address(hex_address: str) -> str:
    """/proc/net/tcp's address (hex, in 32-bit words of host byte order) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def pids_on(port: int, found: list[Listener]) -> set[int]:
    return {listener.pid for listener in found if listener.port == port}


def is_local(host: str) -> bool:
    """Whether `host` names this machine (a loopback address or this host's name)."""
    if host in ("localhost", socket.gethostname()):
        return True
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def cpu_s(pid: int) -> float | None:
    """CPU seconds `pid` has used so far, user + system, all its threads; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime, stime (fields 14, 15 of stat)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of `pid` (VmRSS), in bytes; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # in kB
    return None

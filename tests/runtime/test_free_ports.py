"""Ports picked for children to bind later lie below the kernel's ephemeral range, where no process's outgoing
connection can take them meanwhile, and a port in use is passed over."""

from __future__ import annotations

import pathlib
import random
import socket

import pytest

from chorus.runtime import processes
from chorus.runtime.processes import EPHEMERAL_PORTS_FILE, LOWEST_PICKED_PORT, free_ports

pytestmark = pytest.mark.skipif(not pathlib.Path(EPHEMERAL_PORTS_FILE).exists(), reason="Linux's ephemeral range")


def test_free_ports_are_distinct_below_the_ephemeral_range_and_bindable():
    first_ephemeral = int(pathlib.Path(EPHEMERAL_PORTS_FILE).read_text().split()[0])
    ports = free_ports(8)
    assert len(set(ports)) == 8
    assert all(LOWEST_PICKED_PORT <= port < first_ephemeral for port in ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        taken = free_ports(1)[0]
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        other = next(port for port in free_ports(3) if port != taken)
        picks = [taken, other, *random.sample(range(LOWEST_PICKED_PORT, 20000), 198)]
        monkeypatch.setattr(processes.random, "sample", lambda population, count: picks)
        assert free_ports(1) == [other]

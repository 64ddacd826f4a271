"""Ports for servers that a test starts in another process (Envoy, Redis, a guard or vLLM of its own), which bind
them only later: free when picked, and below the kernel's ephemeral range, so that no connection opened meanwhile
(by this test or another worker's) takes one as its local port first. Each pytest-xdist worker picks from a slice
of its own."""

from __future__ import annotations

import os
import random
import socket

FLOOR = 10_000
_pick = random.SystemRandom()  # not the random module's state, which tests seed


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            low, high = (int(port) for port in ports.read().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port() -> int:
    low, _ = ephemeral_range()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % max(workers, 1)
    width = (low - FLOOR) // max(workers, 1)
    if width < 100:
        return _any_port()
    start = FLOOR + worker * width
    for _ in range(200):
        port = _pick.randrange(start, start + width)
        with socket.socket() as sock:  # no SO_REUSEADDR: a port with connections still in TIME_WAIT is not free
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    return _any_port()


def _any_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port

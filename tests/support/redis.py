"""A real redis-server (Debian's package) on a free loopback port, with nothing written to disk; it can be stopped
and started again on the same port, as a Redis that goes away and comes back. `make test` and `.ci/run` install
the package when it is missing."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.support.polling import eventually
from tests.support.ports import free_port

SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                   "--protected-mode", "no", "--loglevel", "warning"]  # fmt: skip
        self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not eventually(lambda: answers_ping(self.port), timeout_s=10.0):
            self.stop()
            raise AssertionError(f"redis-server on port {self.port} never answered PING")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop it (SIGKILL: as a crash); the port is free again when this returns."""
        process, self._process = self._process, None
        if process is None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="redis")
def fixture_redis() -> Iterator[RedisServer]:
    """A fresh redis-server for one test (a test module imports this function, `# noqa: F401`, and asks for
    `redis`)."""
    with redis_server() as server:
        yield server

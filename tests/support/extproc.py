"""`token-guard extproc` in a process (and process group) of its own, as Kubernetes runs it, for the tests that signal
it; and gRPC's health service asked as Envoy's health checks and Kubernetes' probes ask it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.servers import MODEL

ROOT = Path(__file__).resolve().parents[2]
STATUSES = {b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}  # grpc.health.v1.HealthCheckResponse, encoded


def health(port: int, service: str = "") -> str:
    """What gRPC's health service answers: SERVING, NOT_SERVING, or the gRPC status code's name of a failed call
    (UNAVAILABLE: nothing listens)."""
    request = b"\n" + bytes([len(service)]) + service.encode() if service else b""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            return STATUSES.get(check(request, timeout=2), "?")
        except grpc.RpcError as exc:
            return str(exc.code().name)


@dataclass
class Processor:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def terminate(self) -> None:
        """SIGTERM to its whole process group (its child processes too), as a terminal or a runtime may send it."""
        os.killpg(self.process.pid, signal.SIGTERM)

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if text in line]


@contextmanager
def extproc(upstream: str, tokenizer: Path, log: Path, port: int | None = None, **env: str) -> Iterator[Processor]:
    """The processor on `port` (a free one when None) in front of `upstream`, once SERVING; `env`: TOKEN_GUARD_*
    settings. Killed on the way out if it is still running."""
    port = port or free_port()
    command = [sys.executable, "-m", "proxy", "extproc", "--upstream", upstream, "--model", MODEL,
               "--tokenizer", str(tokenizer), "--port", str(port), "--log-level", "info"]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        up = eventually(lambda: process.poll() is not None or health(port) == "SERVING", timeout_s=90)
        assert up and process.poll() is None, log.read_text()
        yield Processor(process, port, log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

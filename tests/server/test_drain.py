"""Graceful shutdown of `token-guard serve`: on SIGTERM it stops accepting, lets the streams in flight finish (up to
server.drain_timeout_s), then exits; past the timeout the streams are cut."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.doctor.samples import BUILTIN_SAMPLES
from proxy.server.running import bind_socket
from tests.support.polling import eventually
from tests.support.servers import MODEL, simulator

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[Any]:
    with simulator(deepseek_dir, itl_s=0.05) as (server, stats, _):  # 20 tokens a second
        yield server, stats


@contextmanager
def serve(
    upstream: str, tokenizer: Path, logs: Path, drain_timeout_s: float
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    with bind_socket() as probe:
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--model", MODEL,
               "--tokenizer", str(tokenizer), "--port", str(port)]  # fmt: skip
    env = {**os.environ, "TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S": str(drain_timeout_s)}
    with logs.open("wb") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = eventually(lambda: process.poll() is not None or _healthy(url), timeout_s=60)
        assert ready and process.poll() is None, logs.read_text()
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def checked(stats: Any) -> None:
    """Once the guard's start-up check has charged its samples (a 1-token generation each), the upstream forgets
    them: the test counts only its own requests."""
    assert eventually(lambda: stats.completed >= len(BUILTIN_SAMPLES) and stats.active == 0, timeout_s=60)
    stats.reset()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False


def refuses_connections(url: str) -> bool:
    port = int(url.rsplit(":", 1)[1])
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def chat(max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "stream": True}


def read_stream(url: str, max_tokens: int, on_first_token: Any) -> str:
    """The stream's text as far as it got; `on_first_token` runs once the first token has arrived."""
    received: list[str] = []
    with httpx.Client(timeout=60) as client:
        try:
            with client.stream("POST", f"{url}/v1/chat/completions", json=chat(max_tokens)) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    received.append(line)
                    if line.startswith("data: ") and len([r for r in received if r.startswith("data: ")]) == 1:
                        on_first_token()
        except httpx.RemoteProtocolError:
            pass  # the server closed the connection mid-stream
    return "\n".join(received)


def test_sigterm_lets_a_stream_in_flight_finish(sim: Any, deepseek_dir: Path, tmp_path: Path) -> None:
    server, stats = sim
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=60) as (process, url):
        checked(stats)
        refused: list[bool] = []

        def terminate() -> None:
            process.send_signal(signal.SIGTERM)
            refused.append(eventually(lambda: refuses_connections(url)))  # a new client is turned away at once

        text = read_stream(url, 60, terminate)  # 60 tokens: about 3 s, far beyond the moment of the signal
        assert refused == [True]
        assert text.rstrip().endswith("data: [DONE]")
        assert process.wait(timeout=60) is not None, "the guard exits once the stream is done"
    assert stats.completed == 1 and stats.aborted == 0


def test_streams_are_cut_when_the_drain_timeout_passes(sim: Any, deepseek_dir: Path, tmp_path: Path) -> None:
    server, stats = sim
    with serve(server.url, deepseek_dir, tmp_path / "guard.log", drain_timeout_s=0.5) as (process, url):
        checked(stats)
        text = read_stream(url, 2000, lambda: process.send_signal(signal.SIGTERM))  # 2000 tokens: about 100 s
        assert '"content"' in text and "[DONE]" not in text
        assert process.wait(timeout=60) is not None
    assert eventually(lambda: stats.aborted == 1)  # and the upstream stopped generating for nobody

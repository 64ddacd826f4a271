"""Clients that leave while the guard's event loop is busy: a loaded loop hands the guard a request and the news that
its client left in the same turn, or the news long after the client went. Reproduced here without sleeps in the
request path: the guard's loop is held (`ServerThread.hold`) while clients at each stage close their connections, so
that everything they did reaches the guard at once when the hold ends. Whatever the order it sees them in, a request
whose client left is not forwarded, or its upstream request is closed and the simulator aborts it: nothing runs to
the end for nobody, and nothing stays held."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.server.running import ServerThread
from tests.support.polling import eventually
from tests.support.servers import MODEL, guard, simulator

HOLD_S = 0.5
EACH = 8  # clients per stage


@pytest.fixture(scope="module")
def stack(deepseek_dir: Path) -> Iterator[tuple[ServerThread, Any]]:
    # A slow upstream (0.3 s to the first token, then 50 tokens/s): no request can end during the test by itself.
    with simulator(deepseek_dir, profile="0.31", max_model_len=2048, ttft_s=0.3, itl_s=0.02) as (sim, stats, _):
        with guard(sim.url, deepseek_dir, **{"model.max_model_len": 2048, "admission.max_inflight_requests": 64}) as g:
            yield g, stats


def send(url: str, request_id: str, stream: bool) -> socket.socket:
    """A whole request on a socket of its own (nothing read yet)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"{request_id}: tell a long story"}],
                       "max_tokens": 1000, "stream": stream}).encode()  # fmt: skip
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"x-request-id: {request_id}\r\ncontent-length: {len(body)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + body)
    return sock


def first_event(sock: socket.socket) -> bool:
    """Read until the answer's first event has arrived (True), or the connection ends or stalls for 30 s."""
    sock.settimeout(30)
    seen = b""
    while b"data: " not in seen:
        data = sock.recv(65536)
        if not data:
            return False
        seen += data
    return True


def leave(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # an abrupt RST
    sock.close()


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((name + " ", name + "{")))


def test_clients_leaving_during_a_busy_turn_leave_no_upstream_work(stack: tuple[ServerThread, Any]) -> None:
    proxy, stats = stack
    received, completed = stats.received, stats.completed
    waiting = [send(proxy.url, f"race-first-byte-{i}", stream=i % 2 == 0) for i in range(EACH)]
    assert eventually(lambda: stats.received - received == EACH)  # forwarded: the upstream works on its first token
    streaming = [send(proxy.url, f"race-streaming-{i}", stream=True) for i in range(EACH)]
    for sock in streaming:
        assert first_event(sock)  # the answer has begun
    proxy.hold(HOLD_S)
    unread = [send(proxy.url, f"race-unread-{i}", stream=i % 2 == 0) for i in range(EACH)]  # arrives while held
    for sock in waiting + streaming + unread:
        leave(sock)
    # The hold ends: the guard sees the new requests and every client's leaving in the same turns.
    assert eventually(lambda: stats.active == 0, timeout_s=30)
    aborted = {request_id for request_id, _ in stats.aborts}
    assert {f"race-first-byte-{i}" for i in range(EACH)} <= aborted
    assert {f"race-streaming-{i}" for i in range(EACH)} <= aborted
    assert stats.completed == completed  # nothing ran to its end for a client that had left
    # The requests that arrived with their client's leaving were not forwarded at all (or, forwarded, aborted).
    assert stats.received - received - 2 * EACH <= sum(f"race-unread-{i}" in aborted for i in range(EACH))
    assert eventually(lambda: metric(proxy.url, "token_guard_inflight_tokens") == 0)
    assert eventually(lambda: metric(proxy.url, "token_guard_client_disconnects_total") >= 3 * EACH)

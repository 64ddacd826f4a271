"""Clients that leave: connections that send a request and close before its answer's headers come."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import Any

from tests.support.polling import eventually


def leave_before_the_headers(
    url: str, path: str, body: dict[str, Any], key: str, clients: int, received: Callable[[], int],
    overflow: str | None = None,
) -> None:  # fmt: skip
    """`clients` connections send `body` with `key` (and an `x-token-guard-overflow` choice) at once, and close once
    `received` says every one of them got where the test wants it (and a moment more), before their answers' headers."""
    payload = json.dumps(body).encode()
    choice = f"x-token-guard-overflow: {overflow}\r\n" if overflow else ""
    request = (f"POST {path} HTTP/1.1\r\nhost: guard\r\ncontent-type: application/json\r\nauthorization: Bearer {key}"
               f"\r\n{choice}content-length: {len(payload)}\r\n\r\n").encode() + payload  # fmt: skip
    port = int(url.rsplit(":", 1)[1])
    conns = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(clients)]
    try:
        for conn in conns:
            conn.sendall(request)
        if not eventually(lambda: received() >= clients, timeout_s=60):
            raise AssertionError(f"{received()} of {clients} requests got there; answered: {answered(conns)}")
        time.sleep(0.3)
    finally:
        for conn in conns:
            conn.close()


def answered(conns: list[socket.socket]) -> list[str]:
    """The first line of whatever each connection has been answered so far, without waiting for more."""
    lines = []
    for conn in conns:
        conn.setblocking(False)
        try:
            lines.append(conn.recv(200).split(b"\r\n", 1)[0].decode(errors="replace"))
        except BlockingIOError:
            lines.append("nothing")
    return lines

"""An upload held part way: its headers and all but the last 1,000 bytes of its body sent (with a Content-Length, or
chunked), the rest sent when the test says, and the answer's status read then."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

REST = 1000  # the bytes held back


def begun(url: str, raw: bytes, chunked: bool) -> socket.socket:
    """A POST of `raw` to /v1/chat/completions at `url`, its last REST bytes held back."""
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None
    conn = socket.create_connection((address.hostname, address.port), timeout=30)
    framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % len(raw)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + framing
    first = raw[:-REST]
    conn.sendall(head + b"\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(first), first) if chunked else first))
    return conn


def ended(conn: socket.socket, raw: bytes, chunked: bool) -> int:
    """The rest of `raw` sent; the answer's status."""
    rest = raw[-REST:]
    conn.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest) if chunked else rest)
    with conn, conn.makefile("rb") as answer:
        return int(answer.readline().split()[1])

"""An HTTP/1.1 upstream on loopback that keeps every request it receives whole, as h11 parses it off the wire: method,
target, headers, body and trailers (which ASGI servers drop before an app could see them). Each is answered 200 with
a small JSON body."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self, cast

import h11

ANSWER = b'{"object":"raw"}'


@dataclass
class Received:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""
    trailers: dict[str, str] = field(default_factory=dict)


class RawUpstream:
    def __init__(self) -> None:
        self.received: list[Received] = []
        kept = self.received

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                _serve(cast(socket.socket, self.request), kept)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="raw-upstream", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()


def _serve(sock: socket.socket, kept: list[Received]) -> None:
    conn, current = h11.Connection(h11.SERVER), None
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = sock.recv(65536)
            if not data:
                return
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            current = Received(event.method.decode(), event.target.decode("latin-1"), _decoded(event.headers))
        elif isinstance(event, h11.Data) and current is not None:
            current.body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage) and current is not None:
            current.trailers = _decoded(event.headers)
            kept.append(current)
            answer = h11.Response(status_code=200, headers=[("content-type", "application/json"),
                                                            ("content-length", str(len(ANSWER)))])  # fmt: skip
            sent = [conn.send(answer), conn.send(h11.Data(data=ANSWER)), conn.send(h11.EndOfMessage())]
            sock.sendall(b"".join(part or b"" for part in sent))
            conn.start_next_cycle()
        elif isinstance(event, h11.ConnectionClosed):
            return


def _decoded(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in headers}

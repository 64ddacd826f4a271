"""An HTTP/2 client over cleartext (prior knowledge, as Envoy's listeners take it) that sends what HTTP/1.1 clients
cannot: a request of headers then trailers, with no body at all, or trailers after a body. The h2 library frames it;
the socket is a real one on loopback."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived, StreamEnded, StreamReset


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def h2c(
    url: str, path: str, headers: dict[str, str], body: bytes | None = None, trailers: dict[str, str] | None = None,
    method: str = "POST", timeout_s: float = 30,
) -> Answer:  # fmt: skip
    """One request on a connection of its own: its headers, `body` if not None (even empty: a DATA frame of no bytes)
    and `trailers` if given, which then end the stream; the answer as it came (status 0: the stream was reset)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        conn = H2Connection(H2Configuration(client_side=True, header_encoding="latin-1"))
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        pseudo = [(":method", method), (":path", path), (":scheme", "http"), (":authority", f"{host}:{port}")]
        conn.send_headers(stream, [*pseudo, *headers.items()], end_stream=body is None and trailers is None)
        if body is not None:
            conn.send_data(stream, body, end_stream=trailers is None)
        if trailers is not None:
            conn.send_headers(stream, list(trailers.items()), end_stream=True)
        sock.sendall(conn.data_to_send())
        return _answer(sock, conn, stream)


def _answer(sock: socket.socket, conn: H2Connection, stream: int) -> Answer:
    answer = Answer(0, {}, b"")
    while data := sock.recv(65536):
        for event in conn.receive_data(data):
            if isinstance(event, ResponseReceived):
                answer.headers = {str(k): str(v) for k, v in event.headers}
                answer.status = int(answer.headers[":status"])
            elif isinstance(event, DataReceived):
                answer.body += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, stream)
            elif isinstance(event, StreamEnded | StreamReset) and event.stream_id == stream:
                return answer
        sock.sendall(conn.data_to_send())
    return answer

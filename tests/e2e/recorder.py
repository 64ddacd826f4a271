"""A recording TCP relay between token-guard and vLLM, so a test can compare what vLLM sent with what the client got.

Comparing a guarded stream with a second, direct one cannot prove byte-for-byte forwarding: vLLM merges tokens into
one SSE event whenever its API server falls behind the engine, so two identical requests are framed differently
under load. The relay sees the very bytes the guard received, and passes them on only after recording them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass, field


@dataclass
class Message:
    start_line: str
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes


@dataclass(frozen=True)
class Exchange:
    request: Message
    response: Message

    @property
    def target(self) -> str:
        return self.request.start_line.split(" ")[1]


@dataclass
class Connection:
    sent: bytearray = field(default_factory=bytearray)  # guard -> vLLM
    received: bytearray = field(default_factory=bytearray)  # vLLM -> guard
    closed_by: str | None = None  # "guard" or "vllm": whichever side hung up first


Mark = dict[int, tuple[int, int]]
Sock = socket.socket
SockPair = tuple[socket.socket, socket.socket]


class Recorder:
    """Listens on a loopback port and relays every connection to `upstream_port`, keeping both directions."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._connections: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="recorder-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._upstream)
            except OSError:  # vLLM is gone; the guard sees a dropped connection, as it would without us
                downstream.close()
                continue
            record = Connection()
            with self._lock:
                self._connections.append(record)
            legs = (
                ("guard", "vllm", downstream, upstream, record.sent),
                ("vllm", "guard", upstream, downstream, record.received),
            )
            for leg in legs:
                args = (*leg, record, (downstream, upstream))
                threading.Thread(target=self._pump, args=args, name="recorder-pump", daemon=True).start()

    def _pump(
        self, side: str, other: str, source: Sock, sink: Sock, log: bytearray, record: Connection, pair: SockPair
    ) -> None:
        closer = side  # the source ended or reset its side...
        try:
            while data := source.recv(65536):
                with self._lock:
                    log.extend(data)  # recorded before it is passed on
                try:
                    sink.sendall(data)
                except OSError:
                    closer = other  # ...unless the write failed: then the other side had hung up first
                    break
        except OSError:
            pass
        finally:  # either side closing closes both, as a proxy that drops its upstream would
            with self._lock:
                record.closed_by = record.closed_by or closer
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def sent_since(self, mark: Mark) -> bool:
        """Whether the guard has sent vLLM anything since `mark`."""
        with self._lock:
            return any(len(c.sent) > mark.get(i, (0, 0))[0] for i, c in enumerate(self._connections))

    def closed_by_guard_since(self, mark: Mark) -> int:
        """How many connections that carried traffic after `mark` the guard has hung up on."""
        with self._lock:
            return sum(
                c.closed_by == "guard" and len(c.sent) > mark.get(i, (0, 0))[0] for i, c in enumerate(self._connections)
            )

    def mark(self) -> Mark:
        with self._lock:
            return {i: (len(c.sent), len(c.received)) for i, c in enumerate(self._connections)}

    def since(self, mark: Mark) -> list[Exchange]:
        """Every complete request/response pair recorded after `mark`, in connection order."""
        exchanges: list[Exchange] = []
        with self._lock:
            snapshot = [(i, bytes(c.sent), bytes(c.received)) for i, c in enumerate(self._connections)]
        for index, sent, received in snapshot:
            sent_from, received_from = mark.get(index, (0, 0))
            requests = parse_messages(sent[sent_from:])
            responses = parse_messages(received[received_from:])
            exchanges.extend(Exchange(q, r) for q, r in zip(requests, responses, strict=False))
        return exchanges

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def parse_messages(data: bytes) -> list[Message]:
    """Split HTTP/1.1 messages (Content-Length or chunked bodies); an incomplete last one is left out."""
    messages: list[Message] = []
    while data:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            break
        start_line, *lines = data[:head_end].decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, value in (ln.split(":", 1) for ln in lines)}
        rest = data[head_end + 4 :]
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = dechunk(rest)
            if parsed is None:
                break
            body, data = parsed
        else:
            length = int(headers.get("content-length", "0"))
            if len(rest) < length:
                break
            body, data = rest[:length], rest[length:]
        messages.append(Message(start_line, headers, body))
    return messages


def dechunk(data: bytes) -> tuple[bytes, bytes] | None:
    """(body, what follows) of a chunked body, or None if it has not all arrived."""
    body = bytearray()
    while True:
        line_end = data.find(b"\r\n")
        if line_end < 0:
            return None
        size = int(data[:line_end].split(b";")[0], 16)
        chunk_end = line_end + 2 + size
        if len(data) < chunk_end + 2:
            return None
        body.extend(data[line_end + 2 : chunk_end])
        data = data[chunk_end + 2 :]
        if size == 0:
            return bytes(body), data

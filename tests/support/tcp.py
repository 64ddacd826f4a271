"""TCP on loopback for the hostile suite: a recording tap in front of an upstream (every connection the guard opens
through it, and every request line it sends, parsed by httptools as a server would), and a listener nobody may reach
(it counts the connections made to it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self

import httptools

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Loop:
    """An asyncio server on a loopback port, in a thread of its own."""

    def __init__(self) -> None:
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(asyncio.start_server(self.serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> Self:
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise RuntimeError(f"{type(self).__name__} did not start")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Forbidden(_Loop):
    """A listener nobody may reach: it counts connections and closes them."""

    def __init__(self) -> None:
        super().__init__()
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 5\r\n\r\nreach")
        await writer.drain()
        writer.close()


class _Requests:
    """httptools' callbacks: each complete request's method and target, in order."""

    def __init__(self, seen: list[tuple[str, str]]) -> None:
        self.seen, self.url, self.parser = seen, b"", httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self.url = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_message_complete(self) -> None:
        self.seen.append((self.parser.get_method().decode(), self.url.decode("latin-1")))


class TcpTap(_Loop):
    """Relays every connection to the upstream at `upstream_port`, recording the connections and the requests."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.connections = 0
        self.requests: list[tuple[str, str]] = []  # (method, target) as the guard sent them, in order

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        requests = _Requests(self.requests)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer, requests), self._pipe(up_reader, writer, None),
                             return_exceptions=True)  # fmt: skip

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parse: _Requests | None) -> None:
        try:
            while data := await reader.read(65536):
                if parse is not None:
                    parse.parser.feed_data(data)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

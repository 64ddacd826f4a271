"""The ASGI vocabulary the server speaks: a request as uvicorn hands it over, read without building objects the guard
does not need, and a response written as bytes. uvicorn (httptools) parses HTTP; nothing here parses it again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from proxy.errors import PayloadTooLarge, RequestTimeout
from proxy.exchange.bodies import Held
from proxy.exchange.headers import Headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
CLIENT_GONE = "token_guard.client_gone"  # scope key: a callable, when (time.monotonic()) the client closed its
# connection, or None while it is open
ON_GONE = "token_guard.on_gone"  # scope key: a list of callbacks the server calls the moment the connection closes
BODY_IN = "token_guard.body_in"  # scope key: a callable, True once the whole body has arrived (so that receive() will
# not wait for it)
TARGET = "token_guard.target"  # scope key: the request line's target exactly as sent (protocol.py)
SENT = "token_guard.sent"  # scope key: a callable, how much of the answer went out: NOTHING, STREAM (a chunked body
# under way), WHOLE (a body of declared length under way) or DONE (protocol.py)
NOTHING, STREAM, WHOLE, DONE = "nothing", "stream", "whole", "done"
ROUTE = "token_guard.route"  # scope key: the request's route in the table (api/routes.Found), set by the app
KEY = "token_guard.key"  # scope key: the request's named API key ([[keys]], settings.KeySettings), set by the app
HELD = "token_guard.held"  # scope key: the request's share of the bodies held at once (exchange/bodies.py), set by
# the app, which gives it back when the request is done

JSON = b"application/json"
JOIN_OFF_LOOP_BYTES = 2**20  # a body this large is joined in a worker thread (31 MB: ~25 ms of the loop's time)


class ClientGone(Exception):
    """The client disconnected before its answer was complete."""


class Incoming:
    """One request's line and headers, as received, and its route: `path` is the route's own (a metric label and the
    log's endpoint; `/v1/responses/{response_id}` for a route with an id), `forward` the path sent upstream, which is
    always a declared route's, and `query` the query string as the client sent it."""

    __slots__ = ("method", "path", "forward", "query", "raw_headers", "client_gone", "on_gone", "body_in", "held")

    def __init__(self, scope: Scope) -> None:
        self.method: str = scope["method"]
        found = scope.get(ROUTE)
        self.path: str = found.route.path if found is not None else scope["path"]
        self.forward: str = found.path if found is not None else scope["path"]
        self.query: str = scope["query_string"].decode("latin-1")
        self.raw_headers: Headers = scope["headers"]
        self.client_gone: Callable[[], float | None] = scope.get(CLIENT_GONE, _never)
        self.on_gone: list[Callable[[], None]] | None = scope.get(ON_GONE)  # None: the server does not call back
        self.body_in: Callable[[], bool] = scope.get(BODY_IN, _not_known)
        self.held: Held | None = scope.get(HELD)

    def leave_if_gone(self) -> None:
        """ClientGone when the client has already closed its connection (the server says so at once, see
        protocol.py; under another server this never raises and ClientWatch notices a moment later)."""
        if self.client_gone() is not None:
            raise ClientGone()

    def header(self, name: bytes) -> str | None:
        """The first value of a header (`name` in lower case, as ASGI gives them)."""
        for key, value in self.raw_headers:
            if key == name:
                return value.decode("latin-1")
        return None

    def headers(self) -> dict[str, str]:
        """Every header (the last value of a repeated one), for forwarding."""
        return {key.decode("latin-1"): value.decode("latin-1") for key, value in self.raw_headers}


async def read_body(receive: Receive, incoming: Incoming, limit: int, timeout_s: float) -> bytes:
    """The whole body: 413 before reading a byte when its declared length is over `limit`, or at the piece that
    takes it past `limit` (nothing more is read; the server discards the rest of the upload); 408 when it has not
    all arrived within `timeout_s`; 503 when the bodies held at once leave no room for it (its declared length,
    before reading a byte, or the piece that would take them past: exchange/bodies.py)."""
    declared = incoming.header(b"content-length")
    held = incoming.held
    hold = held.grow if held is not None else _any_size
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            raise PayloadTooLarge.over(limit)
        if held is not None:
            held.check(int(declared))
    pieces: list[bytes] = []
    size = 0
    if incoming.body_in():  # the usual small request: it came with its headers, so nothing can keep it waiting and
        # no deadline is armed (asyncio.timeout costs ~10 us, a tenth of what a bare relay spends on a request)
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise PayloadTooLarge.over(limit)
        hold(len(body))
        if not message.get("more_body", False):
            return body
        pieces, size = [body], len(body)
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone()
                piece = message.get("body", b"")
                size += len(piece)
                if size > limit:
                    raise PayloadTooLarge.over(limit)
                hold(size)
                pieces.append(piece)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout_s:g} s (server.read_timeout_s); got {size} bytes."
        ) from None
    if len(pieces) == 1:
        return pieces[0]
    if size < JOIN_OFF_LOOP_BYTES:
        return b"".join(pieces)
    return await asyncio.to_thread(b"".join, pieces)  # a large join lets go of the interpreter lock: the loop runs on


class Reply:
    """The response side of one request: what was sent so far, so that an error can still be answered properly
    before the status line went out, and only then."""

    __slots__ = ("_send", "status", "started", "finished")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None
        self.started = False
        self.finished = False

    async def start(self, status: int, headers: Headers) -> None:
        self.status, self.started = status, True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, body: bytes) -> None:
        await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def end(self, body: bytes = b"") -> None:
        self.finished = True
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def whole(self, status: int, headers: Headers, body: bytes, content_type: bytes = JSON) -> None:
        """A complete response with a Content-Length."""
        length = [(b"content-length", str(len(body)).encode()), (b"content-type", content_type)]
        await self.start(status, [*headers, *length])
        await self.end(body)


def _never() -> float | None:
    return None


def _any_size(size: int) -> None:
    """No share to hold: a body read outside the app (exchange/bodies.py bounds the app's)."""


def _not_known() -> bool:
    return False

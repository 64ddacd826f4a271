"""uvicorn's httptools protocol with deadlines for a request's headers and for a client that stops reading, and its
parser errors in the OpenAI envelope.

uvicorn waits for a request's headers for ever: a client that opens connections and sends nothing, or sends its
headers a byte at a time, holds a connection and a file descriptor as long as it likes. Here a connection that has
not finished a request's headers within `header_timeout_s` is answered 408 and closed (or just closed, if it never
started one); a request line and headers larger than `max_header_bytes` (the parser would buffer any size) get 431,
whether they arrive in one read or many, while still incomplete or once complete. A refusal for a request pipelined
behind others waits for their answers, so that it is never written into the middle of one.
What the parser (llhttp) refuses as not HTTP gets uvicorn's 400, here in the usual error envelope instead of plain
text (error_bodies.raw_reply). The body's own deadline is the app's (asgi.read_body). A request answered before its
body was read (a 413, or a 503 when the bodies held at once are at their limit) has the rest of its body read and
dropped, within `header_timeout_s`, before the connection serves another: neither counted as the next request's
headers (which once got an upload a spurious 431 and a reset) nor cut by uvicorn's keep-alive timer while it arrives.

uvicorn also waits for ever for a client that stops reading its answer: the request's task sleeps in send() holding
its admission ticket and its key's reservation. The transport's flow control says when its buffer is full
(pause_writing) and when it drained (resume_writing); a connection that stays paused for `write_timeout_s` is aborted,
which reaches the request as any disconnect does (connection_lost, then the client-gone callbacks). A timer armed
only while paused costs nothing per piece, where a deadline around every send would cost ~10 us each.

The limits come with the protocol factory uvicorn is given (`protocol_factory`), one per server, so that nothing
process-wide is set. uvicorn's protocol is internal to it: tests/server/test_uvicorn_contract.py checks what this
subclass relies on, and pyproject.toml holds uvicorn to the versions it was checked on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from proxy import error_bodies
from proxy.errors import GuardError, HeaderTooLarge, InvalidRequest, RequestTimeout
from proxy.server.asgi import BODY_IN, CLIENT_GONE, DONE, NOTHING, ON_GONE, SENT, STREAM, TARGET, WHOLE

log = logging.getLogger("token_guard.server")
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 30.0  # server.read_timeout_s
    max_header_bytes: int = 64 * 1024
    write_timeout_s: float = 30.0  # server.write_timeout_s


class _StopParsing(Exception):
    """Raised in a parser callback: the parser stops, and uvicorn answers through send_400_response."""


class GuardedHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, limits: ConnectionLimits = ConnectionLimits(), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s, self.write_timeout_s = limits.header_timeout_s, limits.write_timeout_s
        self.max_header_bytes = limits.max_header_bytes
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None  # armed while the client leaves the guard's writes unread
        self._header_bytes = 0  # received since the current request's headers began, while they are incomplete
        self._read = 0  # the size of the data being parsed
        self._since_begin = 0  # at least the bytes of the current request so far (from the read it began in)
        self._too_large = False  # the parser was stopped for the size of a request's headers
        self._refusal: GuardError | None = None  # written once the answers to the requests before it are out
        self._in_request = False
        self._dropping = False  # the rest of the body of a request answered before it was read is arriving
        self._lost_at: float | None = None  # when the connection closed (time.monotonic())
        self._on_gone: list[Callable[[], None]] = []  # the current request's, called when the connection closes

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost_at = time.monotonic()
        self._disarm()
        self._unstall()
        super().connection_lost(exc)
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete:
            # In this callback, not a loop turn or two later through the ASGI receive channel: on a busy loop every
            # turn is long, and the upstream request is only closed once the request's task is cancelled.
            for callback in self._on_gone:
                try:
                    callback()
                except Exception:  # one broken callback must not keep the others from their client's news
                    log.exception("a client-gone callback failed")

    def data_received(self, data: bytes) -> None:
        waiting = self._deadline is not None and not self._dropping
        self._read = len(data)
        self._since_begin += self._read
        super().data_received(data)
        if self._dropping:
            self._unset_keepalive_if_required()
        elif waiting and self._deadline is not None:  # the headers are still incomplete after this data
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(self._header_too_large())

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled is None:
            self._stalled = self.loop.call_later(self.write_timeout_s, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unstall()

    def _unstall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _not_reading(self) -> None:
        self._stalled = None
        log.info("client %s read nothing of its answer for %g s (server.write_timeout_s): connection aborted",
                 _address(self.client), self.write_timeout_s)  # fmt: skip
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # a reset: the kernel drops what it still holds for the client too, instead of
            with contextlib.suppress(OSError):  # trying to deliver it for minutes after the guard let go
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        self.transport.abort()  # not close(), which would wait for the unread bytes to go out

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._refuse(self._header_too_large())
        else:
            self._refuse(InvalidRequest(f"{msg} (the request line or headers could not be parsed)"))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_request = True
        self._since_begin = self._read  # the whole read it began in: more than its own bytes, never fewer
        self._arm()  # the next request on a kept-alive connection gets its own deadline

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._since_begin > self.max_header_bytes and self._header_size() > self.max_header_bytes:
            self._too_large = True  # measured only when its read(s) could hold that much: nothing on the hot path
            raise _StopParsing()
        super().on_headers_complete()
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.scope is self.scope:
            # Known at once, where the app could only learn it from a receive() that runs after its own next step:
            # a request whose client left while it waited for its turn is not counted, nor forwarded. The time it
            # left measures how long the guard takes to cancel its upstream work (token_guard_cancel_seconds).
            self.scope[CLIENT_GONE] = lambda: self._lost_at if cycle.disconnected else None
            self._on_gone = self.scope[ON_GONE] = []
            self.scope[BODY_IN] = lambda: not cycle.more_body  # the parser has seen the body's end
            self.scope[TARGET] = self.url  # the target as sent: uvicorn keeps only the path of an absolute-form one
            self.scope[SENT] = lambda: _sent(cycle)  # what a request cut at the drain's end can still be told

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._dropping:  # the body answered unread is all in: the connection is idle, the next headers are due
            self._dropping = False
            self._disarm()
            self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._in_request = False
        cycle = getattr(self, "cycle", None)
        self._dropping = cycle is not None and cycle.response_complete and cycle.more_body
        if self._refusal is not None:
            self._refuse(self._refusal)
        elif not self.transport.is_closing():
            self._arm()  # idle between requests: uvicorn's keep-alive timeout applies too, and the shorter wins

    def _header_size(self) -> int:
        """The request line and headers as parsed (the method and version aside)."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _header_too_large(self) -> HeaderTooLarge:
        return HeaderTooLarge(f"The request line and headers are larger than {self.max_header_bytes} bytes.")

    def _arm(self) -> None:
        if self._deadline is None:
            self._header_bytes = 0
            self._deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._in_request:
            self._refuse(RequestTimeout(f"The request headers did not arrive within {self.header_timeout_s:g} s "
                                        "(server.read_timeout_s)."))  # fmt: skip
        else:
            self.transport.close()

    def _refuse(self, error: GuardError) -> None:
        """Answer `error` and close, once every answer to a request before this one is out."""
        self._disarm()
        if self.transport.is_closing() or self._refusal not in (None, error):
            return  # already answered, or to be: the parser stays stopped, and says so again on the next read
        cycle = getattr(self, "cycle", None)
        if cycle is not None and not cycle.response_complete and cycle.scope is not self.scope:
            self._refusal = error  # an earlier request's answer is still going out
            self.flow.pause_reading()
            return
        self._refusal = None
        self.transport.write(error_bodies.raw_reply(error))
        self.transport.close()


def protocol_factory(limits: ConnectionLimits) -> Callable[..., GuardedHttpProtocol]:
    """What uvicorn's `http` option is given: it calls it with its own arguments for each connection. A partial of a
    module-level class, so that uvicorn's config still pickles into the worker processes of `serve --workers N`."""
    return partial(GuardedHttpProtocol, limits=limits)


def _sent(cycle: RequestResponseCycle) -> str:
    if not cycle.response_started:
        return NOTHING
    if cycle.response_complete:
        return DONE
    return STREAM if cycle.chunked_encoding else WHOLE


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "(unknown)"

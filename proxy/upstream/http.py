"""The HTTP client toward the upstream: the only module that imports aiohttp, and the one place its errors become the
guard's own (`UpstreamRefused`, `UpstreamConnectTimeout`, `UpstreamUnavailable`, `UpstreamTimeout`).

aiohttp rather than httpx: on the guard's hot path httpx's connection pool and request/response models cost more CPU
than everything else the guard does (bench/results/2026-12-03/ceiling-fe63219.md, the guard on httpx, against
ceiling-9478fed.md, on aiohttp). One session serves every replica; it sends the client's headers and body as they are
(no added User-Agent, Accept, Accept-Encoding or Content-Type, no cookie jar, no decompression, no redirects
followed), and relays the answer's raw bytes.

An answer is opened when its status and headers have arrived, within the shorter of first_byte_timeout_s and
read_timeout_s; its body is then read whole or relayed piece by piece as it comes, each wait for the next piece at
most read_timeout_s (silence.py). Closing an answer that was not read to its end closes its connection, which is what
makes vLLM abort the generation. What is read whole has a limit (transport.py).

`HttpClient` is the guard's transport.Transport: what the guard serves with, passed in where the upstream is built.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping

import aiohttp
from yarl import URL

from proxy.errors import (
    GuardError,
    UpstreamConnectTimeout,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.settings import UpstreamSettings
from proxy.upstream.silence import SilenceWatch
from proxy.upstream.transport import GET_BYTES, Answer

NOT_ADDED = ("user-agent", "accept", "accept-encoding", "content-type")  # aiohttp adds them when a request lacks them
# An idle pooled connection is dropped before the upstream drops it (vLLM's and uvicorn's keep-alive is 5 s): reusing
# one the upstream is closing at that moment fails a request that never reached it ("server disconnected", a 502).
KEEPALIVE_S = 3.0


def translate(exc: BaseException) -> GuardError:
    """The guard's error for an aiohttp failure, worded without the library's class names, nor the upstream's
    address: the message is the client's (the guard's own log lines name the replica)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamConnectTimeout("The upstream did not answer in time (no connection).")
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return UpstreamTimeout("The upstream did not answer in time (silent for read_timeout_s).")
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout("The upstream did not answer in time (no response headers).")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamRefused("The upstream could not be reached (connection refused).")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientOSError):
        return UpstreamUnavailable("The upstream broke the connection.")
    return UpstreamUnavailable(f"The upstream answered something that is not HTTP ({type(exc).__name__}).")


def not_added(headers: Mapping[str, str]) -> list[str] | None:
    """The headers aiohttp must be told not to add, because the request lacks them: None, aiohttp's fast path, for
    the usual client that sends all four (a session-wide skip list cost ~10 us on every request)."""
    present = {name.lower() for name in headers}
    return [name for name in NOT_ADDED if name not in present] or None


class UpstreamResponse(Answer):
    """An upstream answer whose status and headers have arrived, from aiohttp; the body is still to be read."""

    def __init__(self, response: aiohttp.ClientResponse, base: str, silence_s: float) -> None:
        self._response = response
        self.url = base
        self._watch = SilenceWatch(silence_s, self._silent)
        self.status = response.status
        self.raw_headers: tuple[tuple[bytes, bytes], ...] = response.raw_headers
        self.headers: Mapping[str, str] = response.headers
        self.content_type = response.headers.get("content-type", "")
        self.is_sse = self.content_type.startswith("text/event-stream")
        self._held: bytes | None = None  # the first piece, when read ahead by first()

    async def first(self) -> bytes:
        if self._held is None:
            try:
                self._held = await self._response.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise translate(exc) from None
            self._watch.heard()
        return self._held

    async def pieces(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they arrive."""
        watch = self._watch
        try:
            if self._held is not None:
                held, self._held = self._held, b""
                if held:
                    yield held
                watch.resume()
            async for piece in self._response.content.iter_any():
                watch.heard()
                yield piece
                watch.resume()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate(exc) from None
        finally:
            watch.stop()

    def _silent(self) -> None:
        # What aiohttp's own read timeout does: the waiting reader wakes up with it.
        self._response.content.set_exception(aiohttp.SocketTimeoutError("Timeout on reading data from socket"))

    def close(self) -> None:
        self._watch.stop()
        if self._response.content.is_eof():
            self._response.release()
        else:
            self._response.close()


class HttpClient:
    """One aiohttp connection pool for every replica, with the upstream timeouts."""

    def __init__(self, settings: UpstreamSettings) -> None:
        # No sock_read: it re-arms a timer on every piece. The wait for the headers has its deadline in open(), the
        # waits for the body's pieces theirs in UpstreamResponse.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout_s)
        self.read_timeout_s = settings.read_timeout_s
        self.header_timeout_s = min(settings.first_byte_timeout_s, settings.read_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._bases: dict[str, URL] = {}  # each replica's base URL, parsed once

    def _client(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop that serves (the app is built before the loop runs).
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
            )
        return self._session

    async def open(
        self, method: str, base: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> UpstreamResponse:
        """Send a request to the replica at `base`; return once the status and headers have arrived, within the
        shorter of first_byte_timeout_s and read_timeout_s. The URL is built from the base's parts and `path` and
        `query` (a declared route's path, and the query as the client sent it, both checked by api/target.py): no
        string joining, so nothing the client sent can change the upstream's host, port or credentials."""
        sending = self._client().request(method, self._url(base, path, query), data=body, headers=headers,
                                         allow_redirects=False, skip_auto_headers=not_added(headers))  # fmt: skip
        try:
            async with asyncio.timeout(self.header_timeout_s):
                response = await sending
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate(exc) from None
        return UpstreamResponse(response, base, self.read_timeout_s)

    def _url(self, base: str, path: str, query: str) -> URL:
        parsed = self._bases.get(base)
        if parsed is None:
            parsed = self._bases[base] = URL(base)
        return URL.build(
            scheme=parsed.scheme, user=parsed.raw_user, password=parsed.raw_password, host=parsed.raw_host or "",
            port=parsed.explicit_port, path=parsed.raw_path.rstrip("/") + path, query_string=query, encoded=True,
        )  # fmt: skip

    async def get(
        self, base: str, path: str, headers: Mapping[str, str], timeout_s: float, limit: int = GET_BYTES
    ) -> tuple[int, bytes]:
        """A small GET read whole (health, discovery, metrics): status and body, at most `limit` bytes of it."""
        try:
            async with asyncio.timeout(timeout_s):
                response = await self._client().get(base + path, headers=headers, allow_redirects=False,
                                                    skip_auto_headers=not_added(headers))  # fmt: skip
                answer = UpstreamResponse(response, base, timeout_s)
                try:
                    return answer.status, await answer.read(limit)
                finally:
                    answer.close()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise translate(exc) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

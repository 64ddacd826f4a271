"""The HTTP client toward the upstream: the only module that imports httpx, and the one place its errors become the
guard's own (`UpstreamRefused`, `UpstreamConnectTimeout`, `UpstreamUnavailable`, `UpstreamTimeout`).

An answer is opened when its status and headers have arrived; its body is then read whole or relayed chunk by chunk
as it comes, and closed for sure when the client goes away (that is what makes vLLM abort the generation).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Mapping

import httpx

from proxy.errors import (
    GuardError,
    UpstreamConnectTimeout,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from proxy.settings import UpstreamSettings


def translate(exc: httpx.HTTPError | TimeoutError, url: str) -> GuardError:
    name = "no response headers in time" if isinstance(exc, TimeoutError) else type(exc).__name__
    if isinstance(exc, httpx.ConnectTimeout):
        return UpstreamConnectTimeout(f"The upstream at {url} did not answer in time ({name}).")
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return UpstreamTimeout(f"The upstream at {url} did not answer in time ({name}).")
    if isinstance(exc, httpx.ConnectError):
        return UpstreamRefused(f"The upstream at {url} could not be reached ({name}).")
    return UpstreamUnavailable(f"The upstream at {url} could not be reached ({name}).")


class UpstreamResponse:
    """An upstream answer whose status and headers have arrived; the body is still to be read."""

    def __init__(self, response: httpx.Response, url: str) -> None:
        self._response = response
        self.url = url
        self.status = response.status_code
        self.headers: Mapping[str, str] = response.headers

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def is_sse(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's raw bytes as they arrive."""
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise translate(exc, self.url) from None

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.HTTPError as exc:
            raise translate(exc, self.url) from None

    async def close(self) -> None:
        """Close even while this task is being cancelled (the client went away). The close runs as a task of its own,
        outside any cancel scope of the request, because a close that is itself cancelled can leave the connection
        open, and then vLLM keeps generating for nobody."""
        closing = asyncio.get_running_loop().create_task(self._close(), context=contextvars.Context())
        _closing.add(closing)
        closing.add_done_callback(_closing.discard)
        await asyncio.shield(closing)

    async def _close(self) -> None:
        try:
            await self._response.aclose()
        except httpx.HTTPError:
            pass


_closing: set[asyncio.Task[None]] = set()  # closes in progress, kept referenced until they finish


class HttpClient:
    """One connection pool for every replica, with the upstream timeouts."""

    def __init__(self, settings: UpstreamSettings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        timeout = httpx.Timeout(
            connect=settings.connect_timeout_s,
            read=settings.read_timeout_s,
            write=settings.write_timeout_s,
            pool=settings.connect_timeout_s,
        )
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)
        self.first_byte_timeout_s = settings.first_byte_timeout_s

    async def open(
        self, method: str, base: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> UpstreamResponse:
        """Send a request to the replica at `base`; return once the status and headers have arrived (within
        first_byte_timeout_s)."""
        params = httpx.QueryParams(query)
        request = self._client.build_request(method, base + path, params=params, headers=headers, content=body)
        try:
            response = await asyncio.wait_for(self._client.send(request, stream=True), self.first_byte_timeout_s)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise translate(exc, base) from None
        return UpstreamResponse(response, base)

    async def get(self, base: str, path: str, headers: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
        """A small GET read whole (health, discovery, metrics): status and body."""
        try:
            response = await self._client.get(base + path, headers=headers, timeout=timeout_s)
        except httpx.HTTPError as exc:
            raise translate(exc, base) from None
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self._client.aclose()

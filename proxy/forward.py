"""Send a request to the upstream and relay its answer byte for byte, streams included.

httpx errors are translated into the guard's errors here and nowhere else. The upstream connection is closed as
soon as the client goes away (that is what makes vLLM abort the generation and free its KV cache).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import TypeVar

import httpx
from starlette.requests import Request
from starlette.types import Receive

from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.records import RequestRecord
from proxy.settings import UpstreamSettings
from proxy.streaming import StreamResponse

log = logging.getLogger("token_guard.forward")

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the upstream answered."""


def translate(exc: httpx.HTTPError, url: str) -> GuardError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"The upstream at {url} did not answer in time ({type(exc).__name__}).")
    return UpstreamUnavailable(f"The upstream at {url} could not be reached ({type(exc).__name__}).")


class Upstream:
    """The HTTP client toward vLLM: one connection pool, opened at start-up and closed at shutdown."""

    def __init__(self, settings: UpstreamSettings, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = settings.url
        timeout = httpx.Timeout(
            connect=settings.connect_timeout_s,
            read=settings.read_timeout_s,
            write=settings.write_timeout_s,
            pool=settings.connect_timeout_s,
        )
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits, transport=transport)

    async def open(self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> httpx.Response:
        """Send the request and return once the upstream's status and headers have arrived (body unread)."""
        request = self._client.build_request(
            method, path, params=httpx.QueryParams(query), headers=forwardable(headers), content=body
        )
        try:
            return await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise translate(exc, self.url) from None

    async def get_json(self, path: str, timeout_s: float) -> object:
        try:
            response = await self._client.get(path, timeout=timeout_s)
            response.raise_for_status()
            return response.json()
        except httpx.HTTPError as exc:
            raise translate(exc, self.url) from None
        except ValueError as exc:
            raise UpstreamUnavailable(f"The upstream at {self.url} answered {path} with invalid JSON.") from exc

    async def is_healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            response = await self._client.get("/health", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        await self._client.aclose()


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    connection_listed = {h.strip().lower() for h in headers.get("connection", "").split(",")}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in connection_listed}


def relay(
    upstream: httpx.Response, extra_headers: Mapping[str, str], url: str, record: RequestRecord
) -> StreamResponse:
    """Relay status, headers and raw body bytes as they arrive; close the upstream when done or abandoned."""
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP - {"content-length"}}
    headers.update(extra_headers)
    is_sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
    body = _body(upstream, is_sse, url, record)
    return StreamResponse(body, status_code=upstream.status_code, headers=headers)


async def _body(upstream: httpx.Response, is_sse: bool, url: str, record: RequestRecord) -> AsyncGenerator[bytes, None]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    except httpx.HTTPError as exc:
        log.warning("upstream %s failed mid-response: %r", url, exc)
        record.upstream_error = "broken_stream"
        if is_sse:  # the status is already sent: tell a streaming client in-band, as vLLM does
            yield translate(exc, url).sse_bytes()
    finally:
        record.upstream_s = time.perf_counter() - record.started
        await close_quietly(upstream)


async def close_quietly(response: httpx.Response) -> None:
    """Close an upstream response even while this task is being cancelled (the client went away). The close runs as
    a task of its own, outside any cancel scope of the request, because a close that is itself cancelled can leave the
    connection open, and then vLLM keeps generating for nobody."""
    closing = asyncio.get_running_loop().create_task(_close(response), context=contextvars.Context())
    _closing.add(closing)
    closing.add_done_callback(_closing.discard)
    await asyncio.shield(closing)


_closing: set[asyncio.Task[None]] = set()  # closes in progress, kept referenced until they finish


async def _close(response: httpx.Response) -> None:
    try:
        await response.aclose()
    except httpx.HTTPError:
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it (and so closing its upstream connection) if the client disconnects first."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work_task, watch_task):
            if not task.done():
                task.cancel()
    if work_task.done() and not work_task.cancelled():
        return work_task.result()
    await asyncio.gather(work_task, return_exceptions=True)
    raise ClientGone()


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def request_target(request: Request) -> tuple[str, str]:
    return request.url.path, request.url.query

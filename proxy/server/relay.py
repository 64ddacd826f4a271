"""Relay the upstream's answer byte for byte, streams included, and close the upstream connection as soon as the
client goes away (that is what makes vLLM abort the generation and free its KV cache). httpx errors are translated
into the guard's errors by `translate`, here and in proxy/upstream.py only.
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
from starlette.responses import Response
from starlette.types import Receive

from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.server.record import RequestRecord
from proxy.server.sanitize import sanitize_upstream_error
from proxy.server.streaming import StreamResponse

log = logging.getLogger("token_guard.forward")

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip

# uvicorn writes its own Date and Server on every response; relaying the upstream's too would send each twice.
NOT_RELAYED = HOP_BY_HOP | {"date", "server"}

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the upstream answered."""


def translate(exc: httpx.HTTPError, url: str) -> GuardError:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"The upstream at {url} did not answer in time ({type(exc).__name__}).")
    return UpstreamUnavailable(f"The upstream at {url} could not be reached ({type(exc).__name__}).")


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    connection_listed = {h.strip().lower() for h in headers.get("connection", "").split(",")}
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in connection_listed}


async def relay_error(upstream: httpx.Response, extra_headers: Mapping[str, str], record: RequestRecord) -> Response:
    """A non-streamed 5xx read whole, so that a traceback or a path in it never reaches the client."""
    try:
        raw = await upstream.aread()
    except httpx.HTTPError as exc:
        raise translate(exc, str(upstream.url)) from None
    finally:
        record.upstream_s = time.perf_counter() - record.started
        await close_quietly(upstream)
    content_type = upstream.headers.get("content-type", "")
    sanitized = sanitize_upstream_error(upstream.status_code, content_type, raw)
    if sanitized is not None:
        log.warning("upstream %s answered %d with internal details, withheld from the client: %r",
                    upstream.url, upstream.status_code, raw[:2000])  # fmt: skip
        content_type = "application/json"
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED | {"content-type"}}
    return Response(sanitized or raw, upstream.status_code, {**headers, **extra_headers}, media_type=content_type)


def relay(
    upstream: httpx.Response, extra_headers: Mapping[str, str], url: str, record: RequestRecord
) -> StreamResponse:
    """Relay status, headers and raw body bytes as they arrive; close the upstream when done or abandoned."""
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED - {"content-length"}}
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

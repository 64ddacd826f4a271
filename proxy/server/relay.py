"""Relay the upstream's answer to the client byte for byte, streams included, closing the upstream connection as
soon as the client goes away (that is what makes vLLM abort the generation and free its KV cache)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response

from proxy.errors import GuardError
from proxy.server.record import RequestRecord
from proxy.server.sanitize import sanitize_upstream_error
from proxy.server.streaming import StreamResponse
from proxy.upstream.headers import HOP_BY_HOP
from proxy.upstream.http import UpstreamResponse

log = logging.getLogger("token_guard.forward")

# uvicorn writes its own Date and Server on every response; relaying the upstream's too would send each twice.
NOT_RELAYED = HOP_BY_HOP | {"date", "server"}


async def relay_error(upstream: UpstreamResponse, extra_headers: Mapping[str, str], record: RequestRecord) -> Response:
    """A non-streamed 5xx read whole, so that a traceback or a path in it never reaches the client."""
    try:
        raw = await upstream.read()
    finally:
        record.upstream_s = time.perf_counter() - record.started
        await upstream.close()
    content_type = upstream.content_type
    sanitized = sanitize_upstream_error(upstream.status, content_type, raw)
    if sanitized is not None:
        log.warning("upstream %s answered %d with internal details, withheld from the client: %r",
                    upstream.url, upstream.status, raw[:2000])  # fmt: skip
        content_type = "application/json"
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED | {"content-type"}}
    return Response(sanitized or raw, upstream.status, {**headers, **extra_headers}, media_type=content_type)


def relay(upstream: UpstreamResponse, extra_headers: Mapping[str, str], record: RequestRecord) -> StreamResponse:
    """Relay status, headers and raw body bytes as they arrive; close the upstream when done or abandoned."""
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in NOT_RELAYED - {"content-length"}}
    headers.update(extra_headers)
    return StreamResponse(_body(upstream, record), status_code=upstream.status, headers=headers)


async def _body(upstream: UpstreamResponse, record: RequestRecord) -> AsyncGenerator[bytes, None]:
    try:
        async for chunk in upstream.chunks():
            yield chunk
    except GuardError as exc:
        log.warning("upstream %s failed mid-response: %s", upstream.url, exc.message)
        record.upstream_error = "broken_stream"
        if upstream.is_sse:  # the status is already sent: tell a streaming client in-band, as vLLM does
            yield exc.sse_bytes()
    finally:
        record.upstream_s = time.perf_counter() - record.started
        await upstream.close()

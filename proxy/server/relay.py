"""Relay the upstream's answer to the client byte for byte, streams included, as the bytes arrive."""

from __future__ import annotations

import logging
import time

from proxy import error_bodies
from proxy.api.models import only_models
from proxy.error_bodies import Envelope
from proxy.errors import GuardError
from proxy.exchange.headers import Headers
from proxy.exchange.record import RequestRecord
from proxy.policy.usage import Charge, TokenEvents
from proxy.policy.usage_event import HiddenUsage
from proxy.server.asgi import Reply
from proxy.upstream.headers import HOP_BY_HOP
from proxy.upstream.sanitize import sanitize_upstream_error
from proxy.upstream.transport import ERROR_BYTES, GET_BYTES, Answer

log = logging.getLogger("token_guard.forward")

# uvicorn writes its own Date and Server on every response; relaying the upstream's too would send each twice.
NOT_RELAYED = frozenset(name.encode() for name in HOP_BY_HOP | {"date", "server"}) - {b"content-length"}


LOCATIONS = (b"location", b"content-location")


def relayed_headers(upstream: Answer, extra: Headers) -> Headers:
    headers = [(k, v) for k, v in upstream.raw_headers if k.lower() not in NOT_RELAYED]
    if any(k.lower() in LOCATIONS for k, _ in headers):
        headers = [(k, _own_origin(v, upstream.url) if k.lower() in LOCATIONS else v) for k, v in headers]
    return headers + extra


def _own_origin(location: bytes, upstream: str) -> bytes:
    """A redirect that names the upstream's own address, made relative: a client that follows it comes back through
    the guard instead of learning where vLLM listens and going around it."""
    origin = upstream.encode("latin-1")
    return location[len(origin) :] or b"/" if location.startswith(origin) else location


async def relay(reply: Reply, upstream: Answer, extra: Headers, record: RequestRecord, envelope: Envelope) -> None:
    """Status, headers and raw body bytes as they arrive. A failure mid-answer ends a stream with an error event in
    the route's `envelope`, as vLLM does; any other answer is cut short (its Content-Length tells the client)."""
    charge = record.charge
    if charge is not None:
        await _relay_charged(reply, upstream, extra, record, envelope, charge)
        return
    await reply.start(upstream.status, relayed_headers(upstream, extra))
    evidence = record.evidence
    try:
        async for piece in upstream.pieces():
            if evidence is not None:  # read for its usage (drift/evidence.py)
                evidence.feed(piece)
            await reply.write(piece)
    except GuardError as exc:
        await _broken(reply, upstream, record, exc, envelope)
        return
    finally:
        record.upstream_s = time.perf_counter() - record.started
    await reply.end()


async def _relay_charged(
    reply: Reply, upstream: Answer, extra: Headers, record: RequestRecord, envelope: Envelope, charge: Charge
) -> None:
    """`relay` for a keyed request: every piece reaches its charge's tail (read before it is written, so that a
    client leaving at the last byte still settles by it), a stream's output events are counted, and the usage event
    the guard asked for is kept from the client (policy/usage_event.py)."""
    await reply.start(upstream.status, relayed_headers(upstream, extra))
    tail, hidden = charge.tail, _hidden(upstream, charge)
    if upstream.is_sse:
        tail.events = TokenEvents()
    try:
        async for piece in upstream.pieces():
            tail.feed(piece)
            out = piece if hidden is None else hidden.feed(piece)
            if out:
                await reply.write(out)
    except GuardError as exc:
        if hidden is not None:  # what it held (a finish event, the start of the next): the client's all the same
            await reply.write(hidden.end())
        await _broken(reply, upstream, record, exc, envelope)
        return
    finally:
        record.upstream_s = time.perf_counter() - record.started
    await reply.end(hidden.end() if hidden is not None else b"")


def _hidden(upstream: Answer, charge: Charge) -> HiddenUsage | None:
    """The filter that takes out the usage event the guard asked for; None when it asked for none, or the answer is
    not the event stream it asked it of (an error, or a length the filter would make untrue)."""
    if not charge.usage_asked or not upstream.is_sse or upstream.status != 200:
        return None
    return None if "content-length" in upstream.headers else HiddenUsage()


async def _broken(reply: Reply, upstream: Answer, record: RequestRecord, exc: GuardError, envelope: Envelope) -> None:
    log.warning("upstream %s failed mid-response: %s", upstream.url, exc.message)
    record.upstream_error = "broken_stream"
    if not upstream.is_sse:
        return  # left incomplete: the server closes the connection, and the length tells the client
    await reply.write(error_bodies.stream_event(exc, envelope))  # the status is out: tell the client in-band
    await reply.end()


async def relay_listed(
    reply: Reply, upstream: Answer, extra: Headers, record: RequestRecord, allowed: tuple[str, ...]
) -> None:
    """A model list read whole (at most GET_BYTES), and relayed with only the models an API key may use."""
    try:
        raw = await upstream.read(GET_BYTES)
    finally:
        record.upstream_s = time.perf_counter() - record.started
    listed = only_models(raw, allowed)
    content_type = b"application/json" if listed is not None else upstream.content_type.encode("latin-1")
    headers = [
        (k, v) for k, v in relayed_headers(upstream, extra) if k.lower() not in (b"content-type", b"content-length")
    ]
    await reply.whole(upstream.status, headers, raw if listed is None else listed, content_type)


async def relay_error(reply: Reply, upstream: Answer, extra: Headers, record: RequestRecord) -> None:
    """A non-streamed 5xx read whole, so that a traceback or a path in it never reaches the client; one larger than
    ERROR_BYTES is not read further (its connection is closed, not drained) and the client gets the guard's own
    error instead of a cut body."""
    try:
        raw, cut = await upstream.head(ERROR_BYTES)
    finally:
        record.upstream_s = time.perf_counter() - record.started
    if record.charge is not None:
        record.charge.tail.feed(raw)
    content_type = upstream.content_type.encode("latin-1")
    sanitized = sanitize_upstream_error(upstream.status, upstream.content_type, raw, cut)
    if cut:
        log.warning("upstream %s answered %d with more than %d bytes, not read further; it began: %r",
                    upstream.url, upstream.status, ERROR_BYTES, raw[:2000])  # fmt: skip
    elif sanitized is not None:
        log.warning("upstream %s answered %d with internal details, withheld from the client: %r",
                    upstream.url, upstream.status, raw[:2000])  # fmt: skip
    if sanitized is not None:
        content_type = b"application/json"
    headers = [
        (k, v) for k, v in relayed_headers(upstream, extra) if k.lower() not in (b"content-type", b"content-length")
    ]
    await reply.whole(upstream.status, headers, sanitized or raw, content_type)

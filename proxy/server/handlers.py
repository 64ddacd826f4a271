"""The routes' handlers, on raw ASGI. A guarded request: the guard decides (policy/guard.py), then the answer is
forwarded, refused or fanned out; everything else is relayed unchanged. Every request gets a record, logged as one
line and fed to the metrics when its answer ends."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from proxy.api.honoured import for_upstream
from proxy.api.routes import Route
from proxy.errors import (
    GuardError,
    ResponseNotFound,
    UpstreamConnectTimeout,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
    internal_error,
)
from proxy.exchange.background import Followed
from proxy.exchange.core import Core
from proxy.exchange.headers import Headers
from proxy.exchange.record import REQUEST_ID, RequestRecord, request_id
from proxy.exchange.stored import ID_ROUTES, Recorder, named_id, owner_of, reach, recorder_for
from proxy.policy.outcome import Answer, Chunked, Forward
from proxy.policy.quota import CHARGE
from proxy.server.asgi import KEY, ROUTE, ClientGone, Incoming, Receive, Reply, Scope, Send, read_body
from proxy.server.chunked import answer_chunked
from proxy.server.disconnect import ClientWatch
from proxy.server.error_reply import send_error
from proxy.server.memory import give_back_after
from proxy.server.relay import relay, relay_error, relay_listed
from proxy.upstream.chunks import ChunkRunner

log = logging.getLogger("token_guard.app")

QUEUE_HEADER = b"x-token-guard-queue-ms"
RESPONSES = "/v1/responses"
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class Handlers:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.guard, self.registry, self.upstream, self.metrics = core.guard, core.registry, core.upstream, core.metrics
        self.flow, self.meter = core.flow, core.meter
        server = core.settings.server
        self.max_body_bytes, self.read_timeout_s = server.max_body_bytes, server.read_timeout_s

    async def guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handle(scope, receive, send, guarded=True)

    async def relayed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A relay route: forwarded unchanged; except that a key held to some models ([[keys]] models) sees only
        those in GET /v1/models, as OpenAI lists the models a key may use, and that a limited key is charged one
        request (no token) before it goes: vLLM works on it (a /tokenize of megabytes costs it as much as a
        prompt's), so it counts against requests_per_minute, a 429 past it."""
        key = scope.get(KEY)
        listed = key.models if key is not None and scope[ROUTE].route.path == "/v1/models" else None
        await self._handle(scope, receive, send, guarded=False, listed=listed)

    async def _reached(self, route: Route, path: str, record: RequestRecord) -> Recorder | None:
        """A retrieve or cancel of a stored response: its key's only, on the replica that holds it (exchange/
        stored.py)."""
        response_id = named_id(route, path)
        if response_id is None:
            return None
        entry = await reach(self.core.ledger, response_id, record.findings.owner)
        return Recorder(self.core.ledger, None, entry, 0, False)

    async def control(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An administrative route, reached with an admin key (the app checked it): forwarded unchanged."""
        await self._handle(scope, receive, send, guarded=False)

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Readiness: the models are known and an upstream replica answers its own /health (which models: only to
        whom may see them, Core.sight)."""
        status, body = await self.core.readiness(self.core.sight(scope["headers"])[1])
        await Reply(send).whole(status, [], json.dumps(body).encode())

    async def alive(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Liveness: the process serves requests, whatever the upstream's state (that is /health's job)."""
        await Reply(send).whole(200, [], b'{"status":"alive"}')

    async def metrics_text(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Prometheus text; key names, per-key usage and model names only to whom may see them (Core.sight)."""
        await Reply(send).whole(200, [], self.core.exposition(scope["headers"]), METRICS_TYPE)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, guarded: bool, listed: tuple[str, ...] | None = None
    ) -> None:
        incoming, reply = Incoming(scope), Reply(send)
        route: Route = scope[ROUTE].route
        record = RequestRecord(request_id(incoming.header(REQUEST_ID)), incoming.method, incoming.path, guarded)
        tagged: Headers = [(REQUEST_ID, record.request_id.encode())]
        key = record.findings.api_key = scope.get(KEY)
        if route.path.startswith(RESPONSES):  # stored responses belong to the key that created them
            record.findings.owner = owner_of(self.core.keys, scope["headers"])
        body, drained = b"", False
        try:
            if incoming.method != "OPTIONS":  # the only OPTIONS let through is a CORS preflight, which has no body
                body = await read_body(receive, incoming, self.max_body_bytes, self.read_timeout_s)
            headers = incoming.headers()
            headers["x-request-id"] = record.request_id  # vLLM makes it the response id
            async with ClientWatch(receive, lambda: reply.finished, incoming.on_gone):
                if guarded:
                    await self._guard(route, reply, incoming, body, headers, record, tagged)
                else:
                    reached = await self._reached(route, incoming.forward, record) if route.path in ID_ROUTES else None
                    if key is not None and key.limited:  # a request of its minute's, no token; nothing for the rest
                        await self.meter.charge(key, 0, CHARGE, record, tagged)
                    await self._forward(reply, incoming, body, headers, record, tagged, route, None, listed, reached)
        except ClientGone:  # its upstream request, chunks or place in the queue are given up by now
            record.client_gone = True
            left = incoming.client_gone()
            record.cancel_s = time.monotonic() - left if left is not None else None
            if not reply.started:
                log.info("client went away before its answer began (%s); upstream work cancelled", incoming.path)
        except GuardError as exc:
            if isinstance(exc, UpstreamTimeout | UpstreamUnavailable):
                record.upstream_error = record.upstream_error or ("timeout" if isinstance(exc, UpstreamTimeout)
                                                                  else "unavailable")  # fmt: skip
            if not reply.started:  # a client too slow to send its body is not kept: its connection closes
                await self.meter.tell(key, record, tagged)
                closing = [*tagged, (b"connection", b"close")] if exc.status == 408 else tagged
                await send_error(reply, exc, closing, route.envelope)
        except Exception:
            log.exception("unexpected error on %s %s (request %s)", incoming.method, incoming.path, record.request_id)
            if not reply.started:
                await send_error(reply, internal_error(), tagged, route.envelope)
        except asyncio.CancelledError:  # uvicorn cuts what outlived server.drain_timeout_s (server/app.py answers it)
            drained = True
            raise
        finally:
            cut = reply.started and not reply.finished
            if record.charge is not None:  # no coroutine for requests without a quota: the hot path
                # a client that left pays its reservation; a stream the drain cut, what it relayed (the guard's cut)
                gone = record.client_gone or (cut and not drained)
                await self.meter.settle(record.charge, record, reply.status, gone)
            self.flow.done(record, reply.status, cut)
            size, body = len(body), b""  # dropped here, so that the trim finds its pages free
            give_back_after(size)

    async def _guard(
        self, route: Route, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str],
        record: RequestRecord, tagged: Headers,
    ) -> None:  # fmt: skip
        outcome, extra = await self.flow.decide(route, body, headers, record, tagged, incoming.leave_if_gone, True)
        headers = for_upstream(route.reads, headers)  # the headers vLLM acts on, as the guard read them
        if isinstance(outcome, Forward):
            if outcome.content_type is not None:  # a form written anew: its own boundary
                headers["content-type"] = outcome.content_type
            recorder = None
            if record.findings.turn is not None:  # a Responses create the ledger follows
                recorder = recorder_for(self.core.ledger, record.findings, self.core.settings.responses.max_bytes)
            await self._forward(reply, incoming, outcome.body, headers, record, extra, route, outcome.cost,
                                recorder=recorder, follows=outcome.follows)  # fmt: skip
        elif isinstance(outcome, Chunked):
            incoming.leave_if_gone()  # counting and cutting took a while: no chunks for a client that left meanwhile
            fanout = outcome.policy.max_fanout
            handed = record.charge.hand if record.charge is not None else None
            runner = ChunkRunner(self.upstream, incoming.forward, headers, fanout, self.metrics.fanout, handed)
            await answer_chunked(reply, outcome, runner, self.guard, extra, record)
        elif isinstance(outcome, Answer):  # answered by the guard itself (count_tokens)
            await reply.whole(200, extra, outcome.body)
        else:
            await send_error(reply, outcome.error, extra, route.envelope)

    async def _forward(
        self, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str], record: RequestRecord,
        extra: Headers, route: Route, cost: int | None, listed: tuple[str, ...] | None = None,
        recorder: Recorder | None = None, follows: str | None = None,
    ) -> None:  # fmt: skip
        """`recorder`: the stored response the request creates or names (exchange/stored.py): its answer is recorded in
        the ledger, and a request naming one is pinned to the replica that holds it. `follows`: a background response's
        id (policy/background.py): vLLM runs it after its answer, so what the request holds is handed to the core's
        followers (exchange/background.py), which poll the replica that answered, rather than given back here."""
        incoming.leave_if_gone()  # nor sent upstream, where vLLM would start on it only to be told to abort
        handed = record.charge.hand if record.charge is not None else None  # once admitted: the key pays from then
        pin = recorder.replica if recorder is not None else None
        try:
            opened = await self.upstream.open(incoming.method, incoming.forward, headers, body, cost, incoming.query,
                                              handed, pin)  # fmt: skip
        except (UpstreamRefused, UpstreamConnectTimeout) as exc:
            if pin is None or recorder is None or recorder.named is None:
                raise
            log.warning("stored response %s: its replica cannot be reached (%s)", recorder.named.id, exc.message)
            raise ResponseNotFound(recorder.named.id) from None
        upstream = opened.response if recorder is None else recorder.tap(opened.response)
        try:
            record.upstream_first_byte_s = time.perf_counter() - record.started
            if upstream.status >= 500:
                record.upstream_error = f"http_{upstream.status}"
            if opened.ticket is not None and opened.ticket.waited_s > 0:
                record.queue_s = opened.ticket.waited_s
                extra = [*extra, (QUEUE_HEADER, str(round(opened.ticket.waited_s * 1000)).encode())]
            if upstream.status >= 500 and not upstream.is_sse:
                await relay_error(reply, upstream, extra, record)
            elif listed is not None and upstream.status == 200 and not upstream.is_sse:
                await relay_listed(reply, upstream, extra, record, listed)
            else:
                await relay(reply, upstream, extra, record, route.envelope)
        finally:
            upstream.close()
            if follows is not None and upstream.status == 200:  # vLLM took it: it runs on after its answer
                self.core.followers.follow(Followed(follows, opened.replica, self.upstream.credentials_of(headers),
                                                    opened.ticket, record.charge, record))  # fmt: skip
                record.charge = None  # settled by the follower, once vLLM says what it used
            else:
                self.upstream.release(opened.ticket)  # streams hold their budget to their last byte
        if recorder is not None:
            await recorder.answered()

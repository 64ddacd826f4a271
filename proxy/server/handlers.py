"""The routes' handlers, on raw ASGI. A guarded request: the guard decides (policy/guard.py), then the answer is
forwarded, refused or fanned out; everything else is relayed unchanged. Every request is one exchange/request.py
Request, whose record is logged as one line and fed to the metrics when its answer ends."""

from __future__ import annotations

import asyncio
import logging
import time

from proxy.api.honoured import for_upstream
from proxy.errors import (
    GuardError,
    ResponseNotFound,
    UpstreamConnectTimeout,
    UpstreamRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
    internal_error,
)
from proxy.exchange.core import Core
from proxy.exchange.own import own_answer
from proxy.exchange.record import REQUEST_ID, request_id
from proxy.exchange.request import Request
from proxy.exchange.stored import ID_ROUTES
from proxy.policy.outcome import Answer, Chunked, Forward
from proxy.server.asgi import KEY, ROUTE, ClientGone, Incoming, Receive, Reply, Scope, Send, read_body
from proxy.server.chunked import answer_chunked
from proxy.server.disconnect import ClientWatch
from proxy.server.error_reply import send_error
from proxy.server.memory import give_back_after
from proxy.server.relay import relay, relay_error, relay_listed
from proxy.upstream.chunks import ChunkRunner

log = logging.getLogger("token_guard.app")


class Handlers:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.guard, self.upstream, self.metrics, self.flow = core.guard, core.upstream, core.metrics, core.flow
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

    async def control(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An administrative route, reached with an admin key (the app checked it): forwarded unchanged."""
        await self._handle(scope, receive, send, guarded=False)

    async def own(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The guard's own probes and metrics (exchange/own.py), answered here rather than by vLLM."""
        status, content_type, body = await own_answer(self.core, scope[ROUTE].route.path, scope["headers"])
        await Reply(send).whole(status, [], body, content_type)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, guarded: bool, listed: tuple[str, ...] | None = None
    ) -> None:
        incoming, reply = Incoming(scope), Reply(send)
        request = Request.begin(self.core, scope[ROUTE].route, scope.get(KEY), request_id(incoming.header(REQUEST_ID)),
                                incoming.method, guarded, scope["headers"])  # fmt: skip
        record = request.record
        body, drained = b"", False
        try:
            if incoming.method != "OPTIONS":  # the only OPTIONS let through is a CORS preflight, which has no body
                body = await read_body(receive, incoming, self.max_body_bytes, self.read_timeout_s)
            headers = incoming.headers()
            headers["x-request-id"] = record.request_id  # vLLM makes it the response id
            async with ClientWatch(receive, lambda: reply.finished, incoming.on_gone):
                if guarded:
                    await self._guard(request, reply, incoming, body, headers)
                else:
                    if request.route.path in ID_ROUTES:  # a stored response's: its key's only, on its replica
                        await request.reached(incoming.forward)
                    if request.limited:  # a request of its minute's, no token; nothing for the rest
                        await request.charge_one()
                    await self._forward(request, reply, incoming, headers, body, listed)
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
                await request.tell()
                tagged = request.tagged
                closing = [*tagged, (b"connection", b"close")] if exc.status == 408 else tagged
                await send_error(reply, exc, closing, request.route.envelope)
        except Exception:
            log.exception("unexpected error on %s %s (request %s)", incoming.method, incoming.path, record.request_id)
            if not reply.started:
                await send_error(reply, internal_error(), request.tagged, request.route.envelope)
        except asyncio.CancelledError:  # uvicorn cuts what outlived server.drain_timeout_s (server/app.py answers it)
            drained = True
            raise
        finally:
            cut = reply.started and not reply.finished
            # a client that left pays its reservation; a stream the drain cut, what it relayed (the guard's cut)
            await request.end(reply.status, cut, record.client_gone or (cut and not drained))
            size, body = len(body), b""  # dropped here, so that the trim finds its pages free
            give_back_after(size)

    async def _guard(
        self, request: Request, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str]
    ) -> None:
        outcome = await self.flow.decide(request, body, headers, incoming.leave_if_gone, True)
        headers = for_upstream(request.route.reads, headers)  # the headers vLLM acts on, as the guard read them
        if isinstance(outcome, Forward):
            if outcome.content_type is not None:  # a form written anew: its own boundary
                headers["content-type"] = outcome.content_type
            if request.record.findings.turn is not None:  # a Responses create the ledger follows
                request.recording()
            await self._forward(request, reply, incoming, headers, outcome)
        elif isinstance(outcome, Chunked):
            incoming.leave_if_gone()  # counting and cutting took a while: no chunks for a client that left meanwhile
            fanout, charge = outcome.policy.max_fanout, request.record.charge
            handed = charge.hand if charge is not None else None
            runner = ChunkRunner(self.upstream, incoming.forward, headers, fanout, self.metrics.fanout, handed)
            await answer_chunked(reply, outcome, runner, self.guard, request.headers, request.record)
        elif isinstance(outcome, Answer):  # answered by the guard itself (count_tokens)
            await reply.whole(200, request.headers, outcome.body)
        else:
            await send_error(reply, outcome.error, request.headers, request.route.envelope)

    async def _forward(
        self, request: Request, reply: Reply, incoming: Incoming, headers: dict[str, str], sent: bytes | Forward,
        listed: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        """`sent`: the body as received (a relay route), or the guard's Forward (its body, KV cost and whether it
        follows a background response). The request's stored response (request.recorder, exchange/stored.py): its
        answer is recorded in the ledger, and a request naming one is pinned to the replica that holds it. A
        background response (policy/background.py) runs after its answer, so what the request holds is handed to the
        core's followers (exchange/background.py), which poll the replica that answered, rather than given back here.
        `listed`: the models a key may use, the only ones its GET /v1/models lists."""
        body, cost, follows = (sent.body, sent.cost, sent.follows) if isinstance(sent, Forward) else (sent, None, None)
        incoming.leave_if_gone()  # nor sent upstream, where vLLM would start on it only to be told to abort
        charge, recorder = request.record.charge, request.recorder
        handed = charge.hand if charge is not None else None  # once admitted: the key pays from then
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
            request.answered(upstream.status)
            request.admitted(opened.ticket)
            extra, record = request.headers, request.record
            if upstream.status >= 500 and not upstream.is_sse:
                await relay_error(reply, upstream, extra, record)
            elif listed is not None and upstream.status == 200 and not upstream.is_sse:
                await relay_listed(reply, upstream, extra, record, listed)
            else:
                await relay(reply, upstream, extra, record, request.route.envelope)
        finally:
            upstream.close()
            taken = follows if upstream.status == 200 else None  # vLLM took it: it runs on after its answer
            request.let_go(opened.ticket, taken, opened.replica, headers)
        if recorder is not None:
            await recorder.answered()

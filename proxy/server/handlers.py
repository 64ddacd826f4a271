"""The routes' handlers, on raw ASGI. A guarded request: the guard decides (policy/guard.py), then the answer is
forwarded, refused or fanned out; everything else is relayed unchanged. Every request gets a record, logged as one
line and fed to the metrics when its answer ends."""

from __future__ import annotations

import json
import logging
import time

from proxy.api.routes import Route
from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.policy.guard import Guard
from proxy.policy.outcome import Answer, Chunked, Forward, Outcome
from proxy.policy.quota import CHARGE, CHECK, TAKE, Verdict
from proxy.policy.usage import Charge
from proxy.server.asgi import (
    ROUTE,
    ClientGone,
    Headers,
    Incoming,
    Receive,
    Reply,
    Scope,
    Send,
    encode_headers,
    read_body,
)
from proxy.server.auth import named_key
from proxy.server.chunked import answer_chunked
from proxy.server.disconnect import ClientWatch
from proxy.server.logs import write_line
from proxy.server.memory import give_back_after
from proxy.server.metrics import Metrics
from proxy.server.quotas import Quotas, over_quota
from proxy.server.record import REQUEST_ID, RequestRecord, log_fields, log_line, request_id
from proxy.server.relay import relay, relay_error, relay_listed
from proxy.server.responses import internal_error, send_error
from proxy.server.turnstile import Turnstile
from proxy.settings import ServerSettings
from proxy.settings.sections import KeySettings
from proxy.upstream.client import Upstream
from proxy.upstream.parts import PartRunner

log = logging.getLogger("token_guard.app")
requests_log = logging.getLogger("token_guard.requests")

QUEUE_HEADER = b"x-token-guard-queue-ms"
HEAVY_BYTES = 8192  # bodies larger than this take turns on the event loop (turnstile.py); small ones never wait
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class Handlers:
    def __init__(
        self, guard: Guard, registry: ModelRegistry, upstream: Upstream, metrics: Metrics, server: ServerSettings,
        quotas: Quotas,
    ) -> None:  # fmt: skip
        self.guard, self.registry, self.upstream, self.metrics, self.quotas = guard, registry, upstream, metrics, quotas
        self.max_body_bytes, self.read_timeout_s = server.max_body_bytes, server.read_timeout_s
        self.turnstile = Turnstile()

    async def guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handle(scope, receive, send, guarded=True)

    async def relayed(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A relay route: forwarded unchanged; except that a key held to some models ([[keys]] models) sees only
        those in GET /v1/models, as OpenAI lists the models a key may use, and that a limited key's answer carries its
        x-ratelimit-* headers from a look at its buckets: relay requests are not metered (nor counted in
        requests_per_minute), as OpenAI counts only requests to its metered endpoints."""
        key = named_key(scope)
        listed = key.models if key is not None and scope[ROUTE].route.path == "/v1/models" else None
        await self._handle(scope, receive, send, guarded=False, listed=listed)

    async def control(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An administrative route, reached with an admin key (the app checked it): forwarded unchanged."""
        await self._handle(scope, receive, send, guarded=False)

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Readiness: the models are known and an upstream replica answers its own /health."""
        body: dict[str, object]
        if self.registry.discovering:
            status, body = 503, {"status": "starting", "detail": "learning the upstream's models"}
        elif not await self.upstream.is_healthy():
            status, body = 503, {"status": "unhealthy", "detail": "no upstream replica answers its /health"}
        else:
            # checked: the start-up check has run, so each model's count source is decided
            status, body = 200, {"status": "ok", "models": self.registry.names, "checked": self.registry.checked}
        await Reply(send).whole(status, [], json.dumps(body).encode())

    async def alive(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Liveness: the process serves requests, whatever the upstream's state (that is /health's job)."""
        await Reply(send).whole(200, [], b'{"status":"alive"}')

    async def metrics_text(self, scope: Scope, receive: Receive, send: Send, full: bool = False) -> None:
        """Prometheus text; key names and per-key usage only when `full` (server.metrics_api_key)."""
        await Reply(send).whole(200, [], self.metrics.exposition(full), METRICS_TYPE)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, guarded: bool, listed: tuple[str, ...] | None = None
    ) -> None:
        incoming, reply = Incoming(scope), Reply(send)
        route: Route = scope[ROUTE].route
        record = RequestRecord(request_id(incoming.header(REQUEST_ID)), incoming.method, incoming.path, guarded)
        tagged: Headers = [(REQUEST_ID, record.request_id.encode())]
        key = record.findings.api_key = named_key(scope)
        body = b""
        try:
            if incoming.method != "OPTIONS":  # a CORS preflight, which needs no key, carries nothing upstream
                body = await read_body(receive, incoming, self.max_body_bytes, self.read_timeout_s)
            headers = incoming.headers()
            headers["x-request-id"] = record.request_id  # vLLM makes it the response id
            async with ClientWatch(receive, lambda: reply.finished, incoming.on_gone):
                if guarded:
                    await self._guard(route, reply, incoming, body, headers, record, tagged)
                else:
                    if key is not None and key.limited:  # a look at its quota, charged nothing; none for the rest
                        await self._tell_quota(key, record, tagged)
                    await self._forward(reply, incoming, body, headers, record, tagged, None, listed)
        except ClientGone:  # its upstream request, parts or place in the queue are given up by now
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
                await self._tell_quota(key, record, tagged)
                closing = [*tagged, (b"connection", b"close")] if exc.status == 408 else tagged
                await send_error(reply, exc, closing, route.envelope)
        except Exception:
            log.exception("unexpected error on %s %s (request %s)", incoming.method, incoming.path, record.request_id)
            if not reply.started:
                await send_error(reply, internal_error(), tagged, route.envelope)
        finally:
            if record.charge is not None:  # no coroutine for requests without a quota: the hot path
                await self._settle(record.charge, record, reply)
            self._done(record, reply)
            size, body = len(body), b""  # dropped here, so that the trim finds its pages free
            give_back_after(size)

    async def _guard(
        self, route: Route, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str],
        record: RequestRecord, tagged: Headers,
    ) -> None:  # fmt: skip
        key = record.findings.api_key
        limited = key is not None and key.limited
        if len(body) > HEAVY_BYTES:  # a large prompt's counting holds the loop for milliseconds: take turns
            if key is not None and limited:  # and is work: a key with nothing left gets nothing counted
                await self._charge_key(key, 0, CHECK, record, tagged)
            await self.turnstile.enter()
        incoming.leave_if_gone()  # nothing is counted for a client that left while its request waited its turn
        try:
            outcome = await self.guard.handle(route, body, headers, record.findings)
        except GuardError as exc:
            if key is not None and limited and exc.status < 500:
                await self._charge_key(key, 0, TAKE, record, tagged)  # a request refused unread still is a request
            raise
        if key is not None and limited:
            await self._charge(key, outcome, record, tagged)
        extra = tagged + encode_headers(outcome.decision.headers())
        if isinstance(outcome, Forward):
            await self._forward(reply, incoming, outcome.body, headers, record, extra, outcome.cost)
        elif isinstance(outcome, Chunked):
            incoming.leave_if_gone()  # counting and cutting took a while: no parts for a client that left meanwhile
            fanout = outcome.policy.max_fanout
            runner = PartRunner(self.upstream, incoming.forward, headers, fanout, self.metrics.fanout)
            await answer_chunked(reply, outcome, runner, self.guard, extra, record.charge)
        elif isinstance(outcome, Answer):  # answered by the guard itself (count_tokens)
            await reply.whole(200, extra, outcome.body)
        else:
            await send_error(reply, outcome.error, extra, route.envelope)

    async def _forward(
        self, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str], record: RequestRecord,
        extra: Headers, cost: int | None, listed: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        incoming.leave_if_gone()  # nor sent upstream, where vLLM would start on it only to be told to abort
        opened = await self.upstream.open(incoming.method, incoming.forward, headers, body, cost, incoming.query)
        upstream = opened.response
        if record.charge is not None:
            record.charge.forwarded = True
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
                await relay(reply, upstream, extra, record)
        finally:
            upstream.close()
            self.upstream.release(opened.ticket)  # streams hold their budget to their last byte

    async def _charge(self, key: KeySettings, outcome: Outcome, record: RequestRecord, tagged: Headers) -> None:
        """Charge a keyed request what it reserves before it is forwarded (input + output cap, the KV cost admission
        uses), settled later against its answer's usage; a request the guard answers itself (count_tokens), forwards
        only to be rendered, or refuses once counted, is charged the tokens it counted: counting is work done."""
        tokens = outcome.cost if isinstance(outcome, Forward) else sum(outcome.costs) if isinstance(outcome, Chunked) \
            else None  # fmt: skip
        if tokens is None:
            record.charged_tokens = outcome.decision.prompt_tokens
            await self._charge_key(key, outcome.decision.prompt_tokens, TAKE, record, tagged)
            return
        verdict = await self._charge_key(key, tokens, CHARGE, record, tagged)
        forwarded = isinstance(outcome, Chunked)  # its parts' summed usage settles it once the merged answer ends
        record.charge = Charge(key, tokens, outcome.decision.prompt_tokens, forwarded, verdict.shared)

    async def _charge_key(
        self, key: KeySettings, tokens: int, mode: int, record: RequestRecord, tagged: Headers
    ) -> Verdict:
        """One charge of a key's quotas (policy/quota.py: CHARGE, TAKE or CHECK); 429 when refused. The answer
        carries the key's x-ratelimit-* headers either way."""
        verdict = await self.quotas.charge(key, tokens, mode)
        tagged[:] = [h for h in tagged if not h[0].startswith(b"x-ratelimit-")] + encode_headers(verdict.headers())
        record.quota_told = True
        if not verdict.allowed:
            record.quota_limited = True
            record.charged_tokens = None
            raise over_quota(key, verdict, max(tokens, 1))
        return verdict

    async def _tell_quota(self, key: KeySettings | None, record: RequestRecord, tagged: Headers) -> None:
        """Every answer to a keyed request says where its key stands, errors and pass-through routes included."""
        if key is None or not key.limited or record.quota_told:
            return
        told = await self.quotas.told(key)
        tagged.extend(encode_headers(told))
        record.quota_told = bool(told)

    async def _settle(self, charge: Charge, record: RequestRecord, reply: Reply) -> None:
        unused = charge.unused(reply.status)
        record.charged_tokens = charge.tokens - unused
        if unused:
            await self.quotas.give_back(charge.key, unused, charge.shared)

    def _done(self, record: RequestRecord, reply: Reply) -> None:
        record.client_gone = record.client_gone or (reply.started and not reply.finished)
        record.finish(reply.status if reply.status is not None else 499)
        self.metrics.observe(record)
        if requests_log.isEnabledFor(logging.INFO):
            fields = log_fields(record)
            write_line(requests_log, log_line(fields), fields)

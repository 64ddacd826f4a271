"""The routes' handlers, on raw ASGI. A guarded request: the guard decides (policy/guard.py), then the answer is
forwarded, refused or fanned out; everything else is relayed unchanged. Every request gets a record, logged as one
line and fed to the metrics when its answer ends."""

from __future__ import annotations

import json
import logging
import time

from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.policy.guard import Guard
from proxy.policy.outcome import Answer, Chunked, Forward, Outcome
from proxy.policy.usage import Charge
from proxy.server.asgi import ClientGone, Headers, Incoming, Receive, Reply, Scope, Send, encode_headers, read_body
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

    async def passthrough(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Relayed unchanged; except that a key held to some models ([[keys]] models) sees only those in
        GET /v1/models, as OpenAI lists the models a key may use, and that a limited key's answer carries its
        x-ratelimit-* headers from a look at its buckets: pass-through requests are not metered (nor counted in
        requests_per_minute), as OpenAI counts only requests to its metered endpoints."""
        key = named_key(scope)
        listed = key.models if key is not None and scope["path"] == "/v1/models" else None
        await self._handle(scope, receive, send, guarded=False, listed=listed)

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Readiness: the models are known and an upstream replica answers its own /health."""
        body: dict[str, object]
        if self.registry.discovering:
            status, body = 503, {"status": "starting", "detail": "learning the upstream's models"}
        elif not await self.upstream.is_healthy():
            status, body = 503, {"status": "unhealthy", "detail": "no upstream replica answers its /health"}
        else:
            status, body = 200, {"status": "ok", "models": self.registry.names}
        await Reply(send).whole(status, [], json.dumps(body).encode())

    async def alive(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Liveness: the process serves requests, whatever the upstream's state (that is /health's job)."""
        await Reply(send).whole(200, [], b'{"status":"alive"}')

    async def metrics_text(self, scope: Scope, receive: Receive, send: Send) -> None:
        await Reply(send).whole(200, [], self.metrics.exposition(), METRICS_TYPE)

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, guarded: bool, listed: tuple[str, ...] | None = None
    ) -> None:
        incoming, reply = Incoming(scope), Reply(send)
        record = RequestRecord(request_id(incoming.header(REQUEST_ID)), incoming.method, incoming.path, guarded)
        tagged: Headers = [(REQUEST_ID, record.request_id.encode())]
        key = record.findings.api_key = named_key(scope)
        body = b""
        try:
            body = await read_body(receive, incoming, self.max_body_bytes, self.read_timeout_s)
            headers = incoming.headers()
            headers["x-request-id"] = record.request_id  # vLLM makes it the response id
            async with ClientWatch(receive, lambda: reply.finished, incoming.on_gone):
                if guarded:
                    await self._guard(reply, incoming, body, headers, record, tagged)
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
                await send_error(reply, exc, closing, incoming.path)
        except Exception:
            log.exception("unexpected error on %s %s (request %s)", incoming.method, incoming.path, record.request_id)
            if not reply.started:
                await send_error(reply, internal_error(), tagged, incoming.path)
        finally:
            if record.charge is not None:  # no coroutine for requests without a quota: the hot path
                await self._settle(record.charge, record, reply)
            self._done(record, reply)
            size, body = len(body), b""  # dropped here, so that the trim finds its pages free
            give_back_after(size)

    async def _guard(
        self, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str], record: RequestRecord,
        tagged: Headers,
    ) -> None:  # fmt: skip
        if len(body) > HEAVY_BYTES:  # a large prompt's counting holds the loop for milliseconds: take turns
            await self.turnstile.enter()
        incoming.leave_if_gone()  # nothing is counted for a client that left while its request waited its turn
        outcome = await self.guard.handle(incoming.path, body, headers, record.findings)
        if record.findings.api_key is not None and record.findings.api_key.limited:
            await self._charge(record.findings.api_key, outcome, record, tagged)
        extra = tagged + encode_headers(outcome.decision.headers())
        if isinstance(outcome, Forward):
            await self._forward(reply, incoming, outcome.body, headers, record, extra, outcome.cost)
        elif isinstance(outcome, Chunked):
            incoming.leave_if_gone()  # counting and cutting took a while: no parts for a client that left meanwhile
            fanout = outcome.policy.max_fanout
            runner = PartRunner(self.upstream, incoming.path, headers, fanout, self.metrics.fanout)
            await answer_chunked(reply, outcome, runner, self.guard, extra, record.charge)
        elif isinstance(outcome, Answer):  # answered by the guard itself (count_tokens)
            await reply.whole(200, extra, outcome.body)
        else:
            await send_error(reply, outcome.error, extra, incoming.path)

    async def _forward(
        self, reply: Reply, incoming: Incoming, body: bytes, headers: dict[str, str], record: RequestRecord,
        extra: Headers, cost: int | None, listed: tuple[str, ...] | None = None,
    ) -> None:  # fmt: skip
        incoming.leave_if_gone()  # nor sent upstream, where vLLM would start on it only to be told to abort
        opened = await self.upstream.open(incoming.method, incoming.target, headers, body, cost)
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
        """Charge a keyed request what it reserves (input + output cap, the KV cost admission uses); requests the
        guard answers or refuses itself are not charged, but told where their key stands."""
        tokens = outcome.cost if isinstance(outcome, Forward) else sum(outcome.costs) if isinstance(outcome, Chunked) \
            else None  # fmt: skip
        verdict = await (self.quotas.peek(key) if tokens is None else self.quotas.charge(key, tokens))
        tagged.extend(encode_headers(verdict.headers()))
        record.quota_told = True
        if not verdict.allowed:
            record.quota_limited = True
            raise over_quota(key, verdict, tokens or 0)
        if tokens is not None:
            forwarded = isinstance(outcome, Chunked)  # its parts' summed usage settles it once the merged answer ends
            record.charge = Charge(key, tokens, outcome.decision.prompt_tokens, forwarded, verdict.shared)

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

"""The routes' handlers. A guarded request: the guard decides (policy/guard.py), then the answer is forwarded,
refused or fanned out; everything else is relayed unchanged. Every request gets a record, logged as one line and fed
to the metrics when its answer ends."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.policy.guard import Guard
from proxy.policy.outcome import Chunked, Forward
from proxy.server.chunked import answer_chunked
from proxy.server.disconnect import ClientGone, unless_disconnected
from proxy.server.metrics import Metrics
from proxy.server.record import REQUEST_ID, RequestRecord, log_fields, log_line, request_id
from proxy.server.relay import relay, relay_error
from proxy.server.responses import error_response
from proxy.server.streaming import StreamResponse
from proxy.upstream.client import Upstream
from proxy.upstream.parts import PartRunner

log = logging.getLogger("token_guard.app")
requests_log = logging.getLogger("token_guard.requests")

QUEUE_HEADER = "x-token-guard-queue-ms"
Handler = Callable[[Request, RequestRecord], Awaitable[Response]]


class Handlers:
    def __init__(self, guard: Guard, registry: ModelRegistry, upstream: Upstream, metrics: Metrics) -> None:
        self.guard, self.registry, self.upstream, self.metrics = guard, registry, upstream, metrics

    async def guarded(self, request: Request) -> Response:
        return await self._recorded(request, True, self._guarded)

    async def passthrough(self, request: Request) -> Response:
        return await self._recorded(request, False, self._passthrough)

    async def health(self, request: Request) -> Response:
        """Readiness: the models are known and an upstream replica answers its own /health."""
        if self.registry.discovering:
            return JSONResponse({"status": "starting", "detail": "learning the upstream's models"}, status_code=503)
        if not await self.upstream.is_healthy():
            return JSONResponse({"status": "unhealthy", "detail": f"upstream {self.upstream.url} is not healthy"}, 503)
        return JSONResponse({"status": "ok", "models": self.registry.names})

    async def alive(self, request: Request) -> Response:
        """Liveness: the process serves requests, whatever the upstream's state (that is /health's job)."""
        return JSONResponse({"status": "alive"})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def _recorded(self, request: Request, is_guarded: bool, handler: Handler) -> Response:
        rid = request_id(request.headers.get(REQUEST_ID))
        record = RequestRecord(rid, request.method, request.url.path, is_guarded)
        try:
            response = await handler(request, record)
        except GuardError as exc:
            if isinstance(exc, UpstreamTimeout | UpstreamUnavailable):
                record.upstream_error = "timeout" if isinstance(exc, UpstreamTimeout) else "unavailable"
            response = error_response(exc)
        response.headers[REQUEST_ID] = record.request_id
        if isinstance(response, StreamResponse):
            response.on_close = lambda gone: self._done(record, response.status_code, gone)
        else:
            self._done(record, response.status_code, response.status_code == 499)
        return response

    def _done(self, record: RequestRecord, status: int, client_gone: bool) -> None:
        record.client_gone = record.client_gone or client_gone
        record.finish(status)
        self.metrics.observe(record)
        fields = log_fields(record)
        requests_log.info("%s", log_line(fields), extra={"fields": fields})

    async def _guarded(self, request: Request, record: RequestRecord) -> Response:
        outcome = await self.guard.handle(request.url.path, await request.body(), request.headers, record.findings)
        headers = outcome.decision.headers()
        if isinstance(outcome, Forward):
            return await self._forward(request, record, outcome.body, headers, outcome.cost)
        if isinstance(outcome, Chunked):
            sent = {**request.headers, REQUEST_ID: record.request_id}
            policy = outcome.policy
            runner = PartRunner(self.upstream, request.url.path, sent, policy.max_fanout, self.metrics.fanout)
            return await answer_chunked(request, outcome, runner, self.guard)
        return error_response(outcome.error, headers)

    async def _passthrough(self, request: Request, record: RequestRecord) -> Response:
        return await self._forward(request, record, await request.body(), {}, None)

    async def _forward(
        self, request: Request, record: RequestRecord, body: bytes, extra: dict[str, str], cost: int | None
    ) -> Response:
        headers = {**request.headers, REQUEST_ID: record.request_id}  # vLLM makes it the response id
        opening = self.upstream.open(request.method, request.url.path, request.url.query, headers, body, cost)
        try:
            opened = await unless_disconnected(request.receive, opening)
        except ClientGone:
            log.info("client went away before the upstream answered %s; upstream request cancelled", request.url.path)
            return Response(status_code=499)
        record.upstream_first_byte_s = time.perf_counter() - record.started
        upstream = opened.response
        if upstream.status >= 500:
            record.upstream_error = f"http_{upstream.status}"
        if opened.ticket is not None and opened.ticket.waited_s > 0:
            record.queue_s = opened.ticket.waited_s
            extra = {**extra, QUEUE_HEADER: str(round(opened.ticket.waited_s * 1000))}
        if upstream.status >= 500 and not upstream.is_sse:
            try:
                return await relay_error(upstream, extra, record)
            finally:
                self.upstream.release(opened.ticket)
        response = relay(upstream, extra, record)
        response.on_release = lambda: self.upstream.release(opened.ticket)  # streams hold budget to their last byte
        return response

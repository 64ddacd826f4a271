"""The ASGI app: guarded routes (the guard decides, this file carries it out), pass-through for everything else, and
the single boundary where the guard's errors become OpenAI-shaped responses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.check.run import drift_warnings
from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.policy.guard import Guard
from proxy.policy.merge import StreamMerger, merge_answers, sum_usage
from proxy.policy.overflow import FanOut, Forward
from proxy.server.auth import ApiKeyAuth
from proxy.server.body_limit import BodyLimit
from proxy.server.metrics import Metrics
from proxy.server.record import REQUEST_ID, RequestRecord, log_fields, log_line, request_id
from proxy.server.relay import ClientGone, relay, relay_error, unless_disconnected
from proxy.server.streaming import StreamResponse
from proxy.settings import Settings
from proxy.upstream.admission import TooBusy
from proxy.upstream.client import Upstream
from proxy.upstream.discovery import discover
from proxy.upstream.parts import Fanout, PartFailed

log = logging.getLogger("token_guard.app")
requests_log = logging.getLogger("token_guard.requests")

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]
SSE = "text/event-stream; charset=utf-8"
Handler = Callable[[Request, RequestRecord], Awaitable[Response]]
QUEUE_HEADER = "x-token-guard-queue-ms"


def create_app(
    settings: Settings, registry: ModelRegistry, transport: httpx.AsyncBaseTransport | None = None
) -> Starlette:
    guard = Guard(settings, registry, Upstream(settings.upstream, settings.admission, transport))
    metrics = Metrics(
        lambda: {name: registry.resolve(name).counter.stats() for name in registry.names},
        lambda: (guard.upstream.admission.queued, {r.url: r.budget.tokens for r in guard.upstream.replicas}),
    )

    async def guarded(request: Request) -> Response:
        return await _recorded(request, True, _guarded)

    async def passthrough(request: Request) -> Response:
        return await _recorded(request, False, lambda r, rec: _forward(r, rec, b"", {}, read_body=True))

    async def _recorded(request: Request, is_guarded: bool, handler: Handler) -> Response:
        record = RequestRecord(
            request_id(request.headers.get(REQUEST_ID)), request.method, request.url.path, is_guarded
        )
        try:
            response = await handler(request, record)
        except GuardError as exc:
            if isinstance(exc, UpstreamTimeout | UpstreamUnavailable):
                record.upstream_error = "timeout" if isinstance(exc, UpstreamTimeout) else "unavailable"
            response = error_response(exc)
        response.headers[REQUEST_ID] = record.request_id
        if isinstance(response, StreamResponse):
            response.on_close = lambda gone: _done(record, response.status_code, gone)
        else:
            _done(record, response.status_code, response.status_code == 499)
        return response

    def _done(record: RequestRecord, status: int, client_gone: bool) -> None:
        record.client_gone = record.client_gone or client_gone
        record.finish(status)
        metrics.observe(record)
        fields = log_fields(record)
        requests_log.info("%s", log_line(fields), extra={"fields": fields})

    async def _guarded(request: Request, record: RequestRecord) -> Response:
        outcome = await guard.handle(request.url.path, await request.body(), request.headers, record)
        if isinstance(outcome, Forward):
            return await _forward(request, record, outcome.body, outcome.headers, cost=outcome.cost)
        if isinstance(outcome, FanOut):
            return await _fan_out(request, record, outcome)
        return error_response(outcome.error, outcome.headers)

    async def _forward(
        request: Request,
        record: RequestRecord,
        body: bytes,
        extra: dict[str, str],
        read_body: bool = False,
        cost: int | None = None,
    ) -> Response:
        body = await request.body() if read_body else body
        headers = {**request.headers, REQUEST_ID: record.request_id}  # vLLM makes it the response id
        opening = guard.upstream.open(request.method, request.url.path, request.url.query, headers, body, cost)
        try:
            opened = await unless_disconnected(request.receive, opening)
        except ClientGone:
            log.info("client went away before the upstream answered %s; upstream request cancelled", request.url.path)
            return Response(status_code=499)
        record.upstream_first_byte_s = time.perf_counter() - record.started
        if opened.response.status_code >= 500:
            record.upstream_error = f"http_{opened.response.status_code}"
        if opened.ticket is not None and opened.ticket.waited_s > 0:
            record.queue_s = opened.ticket.waited_s
            extra = {**extra, QUEUE_HEADER: str(round(opened.ticket.waited_s * 1000))}
        streamed = opened.response.headers.get("content-type", "").startswith("text/event-stream")
        if opened.response.status_code >= 500 and not streamed:
            try:
                return await relay_error(opened.response, extra, record)
            finally:
                guard.upstream.release(opened.ticket)
        response = relay(opened.response, extra, opened.replica, record)
        response.on_release = lambda: guard.upstream.release(opened.ticket)  # streams hold budget to their last byte
        return response

    async def _fan_out(request: Request, record: RequestRecord, fan: FanOut) -> Response:
        headers = {**request.headers, REQUEST_ID: record.request_id}
        fanout = Fanout(guard.upstream, request.url.path, headers, fan.policy.max_fanout, metrics.fanout)
        try:
            if fan.stream and fan.policy.chunk_merge == "concat":
                merger = StreamMerger(fan.kind, len(fan.bodies), fan.policy.chunk_separator, fan.include_usage)
                body = await unless_disconnected(request.receive, fanout.stream(fan.bodies, fan.costs, merger))
                return StreamResponse(body, headers=fan.headers, media_type=SSE)
            return await unless_disconnected(request.receive, _answer(fanout, fan))
        except ClientGone:
            log.info("client went away during a chunked request; %d parts cancelled", len(fan.bodies))
            return Response(status_code=499)
        except (PartFailed, GuardError, ExceptionGroup) as exc:
            failure = _first_failure(exc)
            if isinstance(failure, PartFailed):  # the upstream's own error for that part, as it said it
                return Response(failure.body, failure.status, headers=fan.headers, media_type=failure.content_type)
            return error_response(failure, fan.headers)

    async def _answer(fanout: Fanout, fan: FanOut) -> Response:
        bodies = [_non_streaming(b) for b in fan.bodies] if fan.stream else fan.bodies
        answers = await fanout.answers(bodies, fan.costs)
        merged = merge_answers(fan.kind, answers, fan.policy.chunk_separator)
        headers = dict(fan.headers)
        if fan.policy.chunk_merge == "reduce":
            reduce = await guard.reduce_body(fan, answers)
            if reduce is None:
                headers["x-token-guard-merge"] = "concat (the combining request would not fit)"
            else:
                headers["x-token-guard-merge"] = "reduce"
                reduce_body, reduce_cost = reduce
                if fan.stream:
                    merger = StreamMerger(fan.kind, 1, "", fan.include_usage, [a.get("usage") for a in answers])
                    streamed = {**reduce_body, "stream": True, "stream_options": {"include_usage": True}}
                    body = await fanout.stream([streamed], [reduce_cost], merger)
                    return StreamResponse(body, headers=headers, media_type=SSE)
                (final,) = await fanout.answers([reduce_body], [reduce_cost])
                merged = merge_answers(fan.kind, [final], "")
                merged["usage"] = sum_usage([a.get("usage") for a in [*answers, final]])
        if fan.stream:  # the client asked for a stream: one merged answer as a stream of chunks
            merger = StreamMerger(fan.kind, 1, "", fan.include_usage)
            return StreamResponse(_replay(merger, merged), headers=headers, media_type=SSE)
        return JSONResponse(merged, headers=headers)

    async def alive(request: Request) -> Response:
        """Liveness: the process serves requests, whatever the upstream's state (that is /health's job)."""
        return JSONResponse({"status": "alive"})

    async def metrics_endpoint(request: Request) -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def health(request: Request) -> Response:
        if registry.discovering:
            return JSONResponse({"status": "starting", "detail": "learning the upstream's models"}, status_code=503)
        if not await guard.upstream.is_healthy():
            return JSONResponse({"status": "unhealthy", "detail": f"upstream {guard.upstream.url} is not healthy"}, 503)
        return JSONResponse({"status": "ok", "models": registry.names})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.ensure_future(_discover(guard)), asyncio.ensure_future(guard.upstream.watch_health())]
        if guard.upstream.auto_budget:
            tasks.append(asyncio.ensure_future(guard.upstream.learn_budgets()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await guard.upstream.aclose()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        Route("/livez", alive, methods=["GET"]),
        Route("/v1/chat/completions", guarded, methods=["POST"]),
        Route("/v1/completions", guarded, methods=["POST"]),
        Route("/{path:path}", passthrough, methods=ALL_METHODS),
    ]
    middleware = [  # outermost first: a client without a key gets its 401 before any of its body is read
        Middleware(ApiKeyAuth, api_keys=settings.server.api_keys),
        Middleware(BodyLimit, max_body_bytes=settings.server.max_body_bytes),
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={GuardError: _guard_error, Exception: _crash},
    )
    app.state.guard = guard
    app.state.metrics = metrics
    return app


def _first_failure(exc: BaseException) -> PartFailed | GuardError:
    if isinstance(exc, PartFailed | GuardError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if isinstance(inner, PartFailed | GuardError | BaseExceptionGroup):
                return _first_failure(inner)
    log.error("a chunked request failed unexpectedly", exc_info=exc)
    return GuardError("token-guard hit an internal error while running a chunked request.")


def _non_streaming(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}


async def _replay(merger: StreamMerger, answer: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    """A finished answer as chunks: the role chunk, the text, the finish chunk, usage, [DONE]."""
    for chunk in merger.chunks_of(answer):
        yield chunk


async def _discover(guard: Guard) -> None:
    while True:
        try:
            cards = await discover(guard.upstream, guard.settings.upstream.startup_wait_s)
        except GuardError as exc:
            log.error("%s; still retrying", exc.message)
            continue
        guard.registry.apply_discovery(cards)
        break
    for line in await drift_warnings(guard.settings, guard.registry, guard.upstream):
        log.warning("%s", line)


def error_response(error: GuardError, headers: dict[str, str] | None = None) -> Response:
    headers = dict(headers or {})
    if isinstance(error, TooBusy):
        headers["retry-after"] = str(error.retry_after_s)
    return Response(error.json_bytes(), status_code=error.status, headers=headers, media_type="application/json")


async def _guard_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GuardError)
    return error_response(exc)


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(GuardError("token-guard hit an internal error; the details are in its log."))

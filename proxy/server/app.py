"""The ASGI app, assembled: the upstream client, the guard, the metrics, the routes and their middlewares, and the
background work of its lifetime (learning the upstream's models, watching replicas' health, reading KV budgets)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.check.run import drift_warnings
from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError
from proxy.policy.guard import Guard
from proxy.server.auth import ApiKeyAuth
from proxy.server.body_limit import BodyLimit
from proxy.server.handlers import Handlers
from proxy.server.metrics import Metrics
from proxy.server.responses import error_response
from proxy.settings import Settings
from proxy.upstream.client import Upstream
from proxy.upstream.discovery import discover

log = logging.getLogger("token_guard.app")

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


def create_app(settings: Settings, registry: ModelRegistry, upstream: Upstream | None = None) -> Starlette:
    upstream = upstream or Upstream(settings.upstream, settings.admission)
    guard = Guard(settings, registry)
    metrics = Metrics(
        lambda: {name: registry.resolve(name).counter.stats() for name in registry.names},
        lambda: (upstream.admission.queued, {r.url: r.budget.tokens for r in upstream.replicas}),
    )
    handlers = Handlers(guard, registry, upstream, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with asyncio.TaskGroup() as group:
            jobs = [_learn_models(settings, registry, upstream), upstream.watch_health()]
            if upstream.auto_budget:
                jobs.append(upstream.learn_budgets())
            tasks = [group.create_task(_logged(job)) for job in jobs]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
        await upstream.aclose()

    routes = [
        Route("/health", handlers.health, methods=["GET"]),
        Route("/metrics", handlers.metrics_text, methods=["GET"]),
        Route("/livez", handlers.alive, methods=["GET"]),
        Route("/v1/chat/completions", handlers.guarded, methods=["POST"]),
        Route("/v1/completions", handlers.guarded, methods=["POST"]),
        Route("/{path:path}", handlers.passthrough, methods=ALL_METHODS),
    ]
    middleware = [  # outermost first: a client without a key gets its 401 before any of its body is read
        Middleware(ApiKeyAuth, api_keys=settings.server.api_keys),
        Middleware(BodyLimit, max_body_bytes=settings.server.max_body_bytes),
    ]
    exception_handlers = {GuardError: _guard_error, Exception: _crash}
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=exception_handlers)
    app.state.upstream = upstream
    app.state.metrics = metrics
    return app


async def _learn_models(settings: Settings, registry: ModelRegistry, upstream: Upstream) -> None:
    """Discovery until it succeeds, then the start-up drift check (warnings only)."""
    while True:
        try:
            cards = await discover(upstream, settings.upstream.startup_wait_s)
        except GuardError as exc:
            log.error("%s; still retrying", exc.message)
            continue
        registry.apply_discovery(cards)
        break
    for line in await drift_warnings(settings, registry, upstream):
        log.warning("%s", line)


async def _logged(job: Awaitable[None]) -> None:
    """A background job whose unexpected failure is logged, and does not take the server down with it."""
    try:
        await job
    except Exception:
        log.exception("a background task failed; the guard keeps serving without it")


async def _guard_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GuardError)
    return error_response(exc)


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(GuardError("token-guard hit an internal error; the details are in its log."))

"""The ASGI app: guarded routes (parse -> count -> decide -> forward), pass-through for everything else, and the
single boundary where the guard's errors become OpenAI-shaped responses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.count import count_chat, count_completion
from proxy.decide import Plan, decide_chat, decide_completion
from proxy.discovery import discover
from proxy.errors import GuardError
from proxy.forward import ClientGone, Upstream, relay, unless_disconnected
from proxy.parse import parse_chat, parse_completion, with_changes
from proxy.registry import ModelRegistry
from proxy.settings import Settings

log = logging.getLogger("token_guard.app")

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


@dataclass
class Guard:
    settings: Settings
    registry: ModelRegistry
    upstream: Upstream

    async def plan(self, path: str, raw: bytes) -> tuple[Plan, bytes]:
        """Parse, count and decide; returns the plan and the body to forward."""
        policy = self.settings.policy
        if path.endswith("/chat/completions"):
            chat = parse_chat(raw)
            model = self.registry.resolve(chat.model)
            plan = decide_chat(chat, await count_chat(model.tokenizer, chat), model.limits(policy))
            body = chat.body
        else:
            completion = parse_completion(raw)
            model = self.registry.resolve(completion.model)
            counts = await count_completion(model.tokenizer, completion)
            plan = decide_completion(completion, counts, model.limits(policy))
            body = completion.body
        return plan, with_changes(body, plan.changes) if plan.changes else raw


def create_app(
    settings: Settings, registry: ModelRegistry, transport: httpx.AsyncBaseTransport | None = None
) -> Starlette:
    guard = Guard(settings, registry, Upstream(settings.upstream, transport))

    async def guarded(request: Request) -> Response:
        raw = await request.body()
        plan, body = await guard.plan(request.url.path, raw)
        if plan.error is not None:
            return error_response(plan.error, plan.headers())
        return await _forward(request, body, plan.headers())

    async def passthrough(request: Request) -> Response:
        return await _forward(request, await request.body(), {})

    async def _forward(request: Request, body: bytes, extra: dict[str, str]) -> Response:
        opening = guard.upstream.open(request.method, request.url.path, request.url.query, request.headers, body)
        try:
            upstream = await unless_disconnected(request.receive, opening)
        except ClientGone:
            log.info("client went away before the upstream answered %s; upstream request cancelled", request.url.path)
            return Response(status_code=499)
        return relay(upstream, extra, guard.upstream.url)

    async def health(request: Request) -> Response:
        if registry.discovering:
            return JSONResponse({"status": "starting", "detail": "learning the upstream's models"}, status_code=503)
        if not await guard.upstream.is_healthy():
            return JSONResponse({"status": "unhealthy", "detail": f"upstream {guard.upstream.url} is not healthy"}, 503)
        return JSONResponse({"status": "ok", "models": registry.names})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.ensure_future(_discover(guard))
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await guard.upstream.aclose()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/chat/completions", guarded, methods=["POST"]),
        Route("/v1/completions", guarded, methods=["POST"]),
        Route("/{path:path}", passthrough, methods=ALL_METHODS),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={GuardError: _guard_error, Exception: _crash})
    app.state.guard = guard
    return app


async def _discover(guard: Guard) -> None:
    while True:
        try:
            cards = await discover(guard.upstream, guard.settings.upstream.startup_wait_s)
        except GuardError as exc:
            log.error("%s; still retrying", exc.message)
            continue
        guard.registry.apply_discovery(cards)
        return


def error_response(error: GuardError, headers: dict[str, str] | None = None) -> Response:
    return Response(error.json_bytes(), status_code=error.status, headers=headers, media_type="application/json")


async def _guard_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GuardError)
    return error_response(exc)


async def _crash(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(GuardError("token-guard hit an internal error; the details are in its log."))

"""The ASGI app, assembled: the upstream client, the guard, the metrics, a route table, and the background work of
its lifetime (learning the upstream's models, watching replicas' health, reading KV budgets).

Raw ASGI rather than a framework's router and middleware stack: on the hot path every object built per request
costs CPU that a sidecar in front of a GPU's token stream cannot spare (bench/results: ceiling)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from proxy.api.pooling import KINDS as POOLING_KINDS
from proxy.check.run import drift_warnings
from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError, MethodNotAllowed
from proxy.policy.guard import Guard
from proxy.server.asgi import Receive, Reply, Scope, Send, encode_headers
from proxy.server.auth import REFUSED, ApiKeys, named_key
from proxy.server.handlers import Handlers
from proxy.server.metrics import Metrics
from proxy.server.quotas import Quotas
from proxy.server.record import REQUEST_ID, request_id
from proxy.server.responses import send_error
from proxy.settings import AdmissionSettings, Settings
from proxy.upstream.client import Upstream
from proxy.upstream.counting import UpstreamCounter
from proxy.upstream.discovery import discover

if TYPE_CHECKING:
    from proxy.shared.link import RedisLink

log = logging.getLogger("token_guard.app")

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
GET = frozenset({"GET", "HEAD"})
POST = frozenset({"POST"})


class GuardApp:
    def __init__(self, settings: Settings, registry: ModelRegistry, upstream: Upstream | None = None) -> None:
        self.settings, self.registry = settings, registry
        self.link = _redis_link(settings.admission)
        self.upstream = upstream or Upstream(
            settings.upstream, settings.admission, workers=settings.server.workers, link=self.link
        )
        self.metrics = Metrics(
            lambda: {name: registry.resolve(name).counter.stats() for name in registry.names},
            lambda: (self.upstream.admission.queued, {r.url: r.budget.tokens for r in self.upstream.replicas}),
        )
        if self.link is not None:
            from proxy.server.shared_metrics import SharedState
            from proxy.upstream.shared_gate import SharedAdmission

            gate = self.upstream.admission
            self.metrics.registry.register(SharedState(self.link, gate if isinstance(gate, SharedAdmission) else None))
        guard = Guard(settings, registry, UpstreamCounter(self.upstream))
        self.quotas = Quotas(settings, self.link)
        handlers = Handlers(guard, registry, self.upstream, self.metrics, settings.server, self.quotas)
        self._routes: dict[str, tuple[frozenset[str], Handler]] = {
            "/health": (GET, handlers.health),
            "/metrics": (GET, handlers.metrics_text),
            "/livez": (GET, handlers.alive),
            "/v1/chat/completions": (POST, handlers.guarded),
            "/v1/completions": (POST, handlers.guarded),
            "/v1/responses": (POST, handlers.guarded),
            "/v1/messages": (POST, handlers.guarded),
            "/v1/messages/count_tokens": (POST, handlers.guarded),
            "/invocations": (POST, handlers.guarded),
            **{path: (POST, handlers.guarded) for path in POOLING_KINDS},
        }
        self._passthrough = handlers.passthrough
        self._keys = ApiKeys(settings.server.api_keys, settings.keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if self._keys and not self._keys.allows(scope):
                await _refuse(scope, send)
                return
            await self._route(scope)(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await send({"type": "websocket.close", "code": 1000})

    def _route(self, scope: Scope) -> Handler:
        path = scope["path"]
        route = self._routes.get(path)
        if route is None and len(path) > 1 and path.endswith("/") and path.rstrip("/") in self._routes:
            # vLLM redirects `/v1/chat/completions/` to the route: answer it as that route, never unguarded
            path = path.rstrip("/")
            route = self._routes[path]
            scope["path"], scope["raw_path"] = path, path.encode()
        if route is None or scope["method"] == "OPTIONS":  # CORS preflight goes through, as vLLM answers it
            return self._passthrough
        if scope["method"] not in route[0]:
            return _not_allowed(route[0], self.quotas)
        return route[1]

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        async with asyncio.TaskGroup() as group:
            jobs = [_learn_models(self.settings, self.registry, self.upstream), self.upstream.watch_health()]
            if self.upstream.auto_budget:
                jobs.append(self.upstream.learn_budgets())
            if self.link is not None:
                jobs += [self.link.watch(), *(self.upstream.shared_jobs() or [_heartbeat(self.link, self.settings)])]
            tasks = [group.create_task(_logged(job)) for job in jobs]
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            for task in tasks:
                task.cancel()
        await self.upstream.aclose()
        if self.link is not None:
            await self.link.aclose()
        await send({"type": "lifespan.shutdown.complete"})


def create_app(settings: Settings, registry: ModelRegistry, upstream: Upstream | None = None) -> GuardApp:
    return GuardApp(settings, registry, upstream)


def _redis_link(admission: AdmissionSettings) -> RedisLink | None:
    """The one link to Redis, when guards share state through it (imported only then)."""
    if admission.redis_url is None:
        return None
    from proxy.shared.link import RedisLink

    return RedisLink(admission.redis_url, admission.redis_timeout_ms)


async def _heartbeat(link: RedisLink, settings: Settings) -> None:
    """This instance's heartbeat in Redis when no shared budget keeps one (`token-guard check` counts them)."""
    from proxy.shared.presence import Presence

    await Presence(link, settings.admission.redis_lease_s).run()


async def _refuse(scope: Scope, send: Send) -> None:
    rid = request_id(next((v.decode("latin-1") for k, v in scope["headers"] if k == REQUEST_ID), None))
    log.info("401 for %s %s: no valid API key (request %s)", scope["method"], scope["path"], rid)
    headers = [(b"www-authenticate", b"Bearer"), (REQUEST_ID, rid.encode())]
    await send_error(Reply(send), REFUSED, headers, scope["path"])


def _not_allowed(methods: frozenset[str], quotas: Quotas) -> Handler:
    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        allowed = ", ".join(sorted(methods))
        error = MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']}; use {allowed}.")
        headers = [(b"allow", allowed.encode())]
        key = named_key(scope)
        if key is not None and key.limited:  # every answer to a limited key tells its quota
            headers += encode_headers(await quotas.told(key))
        await send_error(Reply(send), error, headers, scope["path"])

    return answer


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

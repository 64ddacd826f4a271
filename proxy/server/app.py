"""The ASGI app, assembled: the upstream client, the guard, the metrics, a route table, and the background work of
its lifetime (learning the upstream's models, watching replicas' health, reading KV budgets).

Raw ASGI rather than a framework's router and middleware stack: on the hot path every object built per request
costs CPU that a sidecar in front of a GPU's token stream cannot spare (bench/results: ceiling)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from proxy.api.routes import OPENAI, Access, Kind, Route, RouteTable
from proxy.api.target import BadTarget, check_target
from proxy.check.run import drift_warnings
from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardError, MethodNotAllowed, RouteNotFound
from proxy.policy.guard import Guard
from proxy.server.asgi import ROUTE, TARGET, Receive, Reply, Scope, Send, encode_headers
from proxy.server.auth import NOT_ADMIN, REFUSED, ApiKeys, named_key
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


class GuardApp:
    def __init__(self, settings: Settings, registry: ModelRegistry, upstream: Upstream | None = None) -> None:
        self.settings, self.registry = settings, registry
        self.link = _redis_link(settings.admission)
        self.upstream = upstream or Upstream(
            settings.upstream, settings.admission, workers=settings.server.workers, link=self.link
        )
        self.metrics = Metrics(
            lambda: {name: registry.resolve(name).counter.stats() for name in registry.names},
            lambda: (
                self.upstream.admission.queued,
                {str(i): r.budget.tokens for i, r in enumerate(self.upstream.replicas)},
            ),  # fmt: skip
        )
        if self.link is not None:
            from proxy.server.shared_metrics import SharedState
            from proxy.upstream.shared_gate import SharedAdmission

            gate = self.upstream.admission
            self.metrics.register(SharedState(self.link, gate if isinstance(gate, SharedAdmission) else None))
        guard = Guard(settings, registry, UpstreamCounter(self.upstream), self.upstream.ceiling)
        self.quotas = Quotas(settings, self.link)
        handlers = Handlers(guard, registry, self.upstream, self.metrics, settings.server, self.quotas)
        server = settings.server
        self.routes = RouteTable(passthrough=server.passthrough_paths)
        for route in self.routes.kept:
            log.warning("server.passthrough_paths: %s is a %s route of the table and stays one", route.path, route.kind)
        for path in self.routes.unguarded:
            log.warning("server.passthrough_paths opens %s unguarded: its requests are relayed without being counted, "
                        "clamped, admitted or charged", path)  # fmt: skip
        self._keys = ApiKeys(server.api_keys, settings.keys, server.admin_api_keys, server.metrics_api_key)
        self._handlers: dict[Kind, Handler] = {
            Kind.GENERATE: handlers.guarded, Kind.POOL: handlers.guarded, Kind.COUNT: handlers.guarded,
            Kind.RELAY: handlers.relayed, Kind.CONTROL: handlers.control,
        }  # fmt: skip
        self._own: dict[str, Handler] = {
            "/health": handlers.health, "/ping": handlers.health, "/livez": handlers.alive,
            "/metrics": self._metrics(handlers),
        }  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await send({"type": "websocket.close", "code": 1000})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The route table decides everything, in this order: a target that is not a plain path is a 400, a path it
        does not declare a 404, a route whose key is missing a 401 (403 for an administrative one), a method it does
        not take a 405; only then does the route's handler see the request."""
        try:
            check_target(scope.get("raw_path") or scope["path"].encode(), scope["path"], scope["query_string"],
                         scope.get(TARGET), _host(scope))  # fmt: skip
        except BadTarget as exc:
            await _refuse(scope, send, exc, OPENAI, closing=True)
            return
        found = self.routes.find(scope["path"])
        if found is None:
            await _refuse(scope, send, _no_route(scope), OPENAI)
            return
        route = found.route
        scope[ROUTE] = found
        method = scope["method"]
        if method == "OPTIONS" and route.who is Access.CLIENT:  # CORS preflight goes through, as vLLM answers it
            await self._handlers[Kind.RELAY](scope, receive, send)
            return
        refusal = self._refusal(route, scope)
        if refusal is not None:
            await _refuse(scope, send, refusal, route.envelope)
            return
        if method not in route.methods:
            await _not_allowed(route, self.quotas)(scope, receive, send)
            return
        handler = self._own[route.path] if route.kind is Kind.OWN else self._handlers[route.kind]
        await handler(scope, receive, send)

    def _refusal(self, route: Route, scope: Scope) -> GuardError | None:
        """Why the request may not use its route, or None when it may."""
        who = route.who
        if who is Access.CLIENT:
            return None if self._keys.client(scope) else REFUSED
        if who is Access.ADMIN:
            return None if self._keys.admin(scope) else NOT_ADMIN
        if who is Access.NOBODY:
            return RouteNotFound(
                f"token-guard does not forward {route.path}: vLLM generates there in a form the guard cannot count "
                "or clamp, so it is closed (server.passthrough_paths opens it unguarded)."
            )
        return None

    def _metrics(self, handlers: Handlers) -> Handler:
        async def metrics(scope: Scope, receive: Receive, send: Send) -> None:
            await handlers.metrics_text(scope, receive, send, full=self._keys.metrics(scope))

        return metrics

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


async def _refuse(scope: Scope, send: Send, error: GuardError, envelope: str, closing: bool = False) -> None:
    """An answer from the route table itself (400, 401, 403, 404): logged, never forwarded."""
    rid = request_id(next((v.decode("latin-1") for k, v in scope["headers"] if k == REQUEST_ID), None))
    log.info("%d for %s: %r (request %r)", error.status, scope["method"], error.message, rid)  # quoted: no forged line
    headers = [(REQUEST_ID, rid.encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if closing:  # a target that is not a path: nothing else on this connection is trusted either
        headers.append((b"connection", b"close"))
    await send_error(Reply(send), error, headers, envelope)


def _no_route(scope: Scope) -> RouteNotFound:
    shown = scope["path"] if len(scope["path"]) <= 200 else scope["path"][:200] + "..."
    return RouteNotFound(f"Invalid URL ({scope['method']} {shown}): token-guard does not serve this route.")


def _host(scope: Scope) -> bytes | None:
    return next((value for name, value in scope["headers"] if name == b"host"), None)


def _not_allowed(route: Route, quotas: Quotas) -> Handler:
    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        allowed = ", ".join(sorted(route.methods))
        error = MethodNotAllowed(f"{scope['method']} is not allowed on {route.path}; use {allowed}.")
        headers = [(b"allow", allowed.encode())]
        key = named_key(scope)
        if key is not None and key.limited:  # every answer to a limited key tells its quota
            headers += encode_headers(await quotas.told(key))
        await send_error(Reply(send), error, headers, route.envelope)

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

"""The ASGI app: the HTTP front end of the guard (exchange/core.py holds what it serves with), dispatching each
request from the route table to its handler, and running the background work of its lifetime.

On SIGTERM or SIGINT uvicorn stops accepting and lets the requests in flight run for server.drain_timeout_s, then
cancels those left (server/running.py). Each is ended as its protocol expects (exchange/drain.py counts them): one
whose answer has not begun gets a 503 in its route's envelope (Retry-After, connection closed), a stream under way
ends with the error event of a failed stream, any other answer under way has its connection closed. The app then
waits a moment for what they held to come back, and closes what it serves with.

Raw ASGI rather than a framework's router and middleware stack: on the hot path every object built per request
costs CPU that a sidecar in front of a GPU's token stream cannot spare (bench/results: ceiling)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from proxy import error_bodies
from proxy.api.routes import Kind, Route
from proxy.counting.registry import ModelRegistry
from proxy.errors import GuardUnavailable
from proxy.exchange.core import Core
from proxy.exchange.entry import Refusal, bodiless, target
from proxy.exchange.headers import encode_headers
from proxy.exchange.record import REQUEST_ID, request_id
from proxy.server.asgi import DONE, HELD, KEY, NOTHING, ROUTE, SENT, STREAM, TARGET, Receive, Reply, Scope, Send
from proxy.server.error_reply import send_error
from proxy.server.handlers import Handlers
from proxy.settings import Settings
from proxy.upstream.transport import Transport

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
CUT_S = 0.5  # how long the requests cut at the drain's end get to answer and give back what they held


class GuardApp:
    def __init__(self, settings: Settings, registry: ModelRegistry, transport: Transport | None = None) -> None:
        self.core = core = Core(settings, registry, transport)
        self.settings, self.registry, self.upstream, self.metrics = settings, registry, core.upstream, core.metrics
        self.link, self.quotas, self.routes, self._door = core.link, core.quotas, core.routes, core.door
        handlers = Handlers(core)
        self._handlers: dict[Kind, Handler] = {
            Kind.GENERATE: handlers.guarded, Kind.POOL: handlers.guarded, Kind.COUNT: handlers.guarded,
            Kind.RELAY: handlers.relayed, Kind.CONTROL: handlers.control,
        }  # fmt: skip
        self._own: Handler = handlers.own

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)
        else:
            await send({"type": "websocket.close", "code": 1000})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The route table decides everything (exchange/entry.py); only then does the route's handler see the
        request."""
        path = scope["path"]
        refusal = target(scope.get("raw_path") or path.encode(), path, scope["query_string"], scope.get(TARGET),
                         _host(scope))  # fmt: skip
        method, headers = scope["method"], scope["headers"]
        empty = method != "OPTIONS" or bodiless(headers)  # only an OPTIONS asks (a CORS preflight has no body)
        entered = self._door.enter(method, path, headers, empty) if refusal is None else refusal
        if isinstance(entered, Refusal):
            await self._refuse(scope, send, entered)
            return
        scope[ROUTE] = entered.found
        if entered.key is not None:
            scope[KEY] = entered.key
        route = entered.found.route
        if entered.preflight:  # relayed without its body (it has none)
            handler = self._handlers[Kind.RELAY]
        else:
            handler = self._own if route.kind is Kind.OWN else self._handlers[route.kind]
        task, drain = asyncio.current_task(), self.core.drain
        assert task is not None
        drain.enter(task)
        held = scope[HELD] = self.core.bodies.hold()  # the body read_body takes in, given back when the request ends
        try:
            await handler(scope, receive, send)
        except asyncio.CancelledError:  # uvicorn's, once server.drain_timeout_s has passed: the request is cut
            if SENT not in scope:  # not uvicorn with the guard's protocol: it answers as it does
                raise
            task.uncancel()
            await self._cut(scope, send, route)
        finally:
            held.release()
            drain.leave(task)

    async def _cut(self, scope: Scope, send: Send, route: Route) -> None:
        """A request cut at the drain's end, ended as its protocol expects."""
        sent, stopping = scope[SENT](), GuardUnavailable.stopping()
        if sent == NOTHING:
            self.core.drain.was_cut("answered 503")
            given = [(k, v) for k, v in scope["headers"] if k == REQUEST_ID][:1]
            await send_error(Reply(send), stopping, [*given, (b"connection", b"close")], route.envelope)
        elif sent == STREAM:
            self.core.drain.was_cut("streams ended with an error event")
            await send({"type": "http.response.body", "body": error_bodies.stream_event(stopping, route.envelope)})
        elif sent != DONE:  # returned unfinished, uvicorn closes the connection: the answer is seen incomplete
            self.core.drain.was_cut("answers whose connection was closed")

    async def _refuse(self, scope: Scope, send: Send, refusal: Refusal) -> None:
        """An answer from the route table itself (400, 401, 403, 404, 405): logged, never forwarded."""
        rid = request_id(next((v.decode("latin-1") for k, v in scope["headers"] if k == REQUEST_ID), None))
        refusal.logged(scope["method"], rid)
        headers = [(REQUEST_ID, rid.encode()), *encode_headers(await refusal.headers(self.quotas))]
        await send_error(Reply(send), refusal.error, headers, refusal.envelope)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        async with self.core:
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown: uvicorn has drained, and cancelled what outlived the drain
            await self.core.drain.all_ended(CUT_S)
        self.core.drain.report("token-guard serve", self.settings.server.drain_timeout_s)
        await send({"type": "lifespan.shutdown.complete"})


def create_app(settings: Settings, registry: ModelRegistry, transport: Transport | None = None) -> GuardApp:
    """`transport`: the HTTP client toward the upstream; None: the guard's own (upstream/http.py)."""
    return GuardApp(settings, registry, transport)


def _host(scope: Scope) -> bytes | None:
    return next((value for name, value in scope["headers"] if name == b"host"), None)

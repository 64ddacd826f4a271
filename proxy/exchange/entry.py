"""The route table's verdict on a request, in the order every front end applies it (api/routes.py): a target that is
not a plain path is a 400, a path the table does not declare a 404, a route whose key is missing a 401 (403 for an
administrative one), a method it does not take a 405. Only a request that passes all four reaches its route's
handler; what it refuses is logged here and never reaches the upstream."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proxy.api.routes import Access, Found, Route, RouteTable
from proxy.api.target import BadTarget, check_target
from proxy.error_bodies import Envelope
from proxy.errors import GuardError, MethodNotAllowed, RouteNotFound
from proxy.exchange.headers import RawHeaders
from proxy.exchange.keys import NOT_ADMIN, REFUSED, ApiKeys
from proxy.exchange.quotas import Quotas
from proxy.settings.sections import KeySettings

log = logging.getLogger("token_guard.app")


PREFLIGHT_HEADERS = (b"origin", b"access-control-request-method")  # what makes an OPTIONS a CORS preflight


@dataclass(frozen=True, slots=True)
class Entry:
    """A request the route table lets through: its route, its named key, and whether it is a CORS preflight (relayed
    without a key and without a body, whatever the route's kind, as vLLM answers it)."""

    found: Found
    key: KeySettings | None = None
    preflight: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer from the route table itself, in `envelope`; `closing`: nothing else on the connection is trusted."""

    error: GuardError
    envelope: Envelope = Envelope.OPENAI
    closing: bool = False
    route: Route | None = None  # a 405's: its Allow header
    key: KeySettings | None = None  # a 405's named key: its answer tells its quota

    async def headers(self, quotas: Quotas) -> dict[str, str]:
        """The headers beside the error's own (request id, Retry-After: the front end's)."""
        headers = {}
        if self.error.status == 401:
            headers["www-authenticate"] = "Bearer"
        if self.closing:
            headers["connection"] = "close"
        if self.route is not None:
            headers["allow"] = ", ".join(sorted(self.route.methods))
        if self.key is not None and self.key.limited:  # every answer to a limited key tells its quota
            headers.update(await quotas.told(self.key))
        return headers

    def logged(self, method: str, request_id: str) -> Refusal:
        log.info("%d for %s: %r (request %r)", self.error.status, method, self.error.message, request_id)  # quoted
        return self


class Door:
    def __init__(self, routes: RouteTable, keys: ApiKeys) -> None:
        self.routes, self.keys = routes, keys

    def enter(self, method: str, path: str, headers: RawHeaders, bodiless: bool) -> Entry | Refusal:
        """The request's route and named key, or why it may not use it. `path` is percent-decoded, its target
        checked (`target()`); `bodiless`: the request has no body (its front end knows how it ends)."""
        found = self.routes.find(path)
        if found is None:
            return Refusal(_no_route(method, path))
        route = found.route
        if method == "OPTIONS" and route.who is Access.CLIENT and bodiless and preflight(headers):
            return Entry(found, None, preflight=True)
        who, key = route.who, None
        if who is Access.CLIENT:
            allowed, key = self.keys.client(headers)
            if not allowed:
                return Refusal(REFUSED, route.envelope)
        elif who is Access.ADMIN and not self.keys.admin(headers):
            return Refusal(NOT_ADMIN, route.envelope)
        elif who is Access.NOBODY:
            return Refusal(RouteNotFound(
                f"token-guard does not forward {route.path}: vLLM generates there in a form the guard cannot count "
                "or clamp, so it is closed (server.passthrough_paths opens it unguarded)."
            ), route.envelope)  # fmt: skip
        if method not in route.methods:
            allowed_methods = ", ".join(sorted(route.methods))
            error = MethodNotAllowed(f"{method} is not allowed on {route.path}; use {allowed_methods}.")
            return Refusal(error, route.envelope, route=route, key=key)
        return Entry(found, key)


def preflight(headers: RawHeaders) -> bool:
    """An OPTIONS request is a CORS preflight when it names its origin and the method it asks for; any other OPTIONS
    is an ordinary request (a key, then a 405)."""
    names = {name for name, _ in headers}
    return all(name in names for name in PREFLIGHT_HEADERS)


def bodiless(headers: RawHeaders) -> bool:
    """HTTP/1.1's framing says there is no body: no Transfer-Encoding, and no Content-Length or a zero one."""
    framing = {name: value for name, value in headers if name in (b"content-length", b"transfer-encoding")}
    return b"transfer-encoding" not in framing and framing.get(b"content-length", b"0").strip() == b"0"


def target(
    raw_path: bytes, path: str, query: bytes, sent: bytes | None = None, host: bytes | None = None
) -> Refusal | None:
    """A 400 for a target that is not a plain origin-form path (api/target.py), which closes the connection."""
    try:
        check_target(raw_path, path, query, sent, host)
    except BadTarget as exc:
        return Refusal(exc, Envelope.OPENAI, closing=True)
    return None


def _no_route(method: str, path: str) -> RouteNotFound:
    shown = path if len(path) <= 200 else path[:200] + "..."
    return RouteNotFound(f"Invalid URL ({method} {shown}): token-guard does not serve this route.")

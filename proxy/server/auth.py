"""API keys, checked as each route of the table requires (api/routes.py): client keys (`server.api_keys`, and the named
keys of `[[keys]]`, whose settings the request carries on to the handler as scope["token_guard.key"] for its quotas),
admin keys (`server.admin_api_keys`, the only keys that reach vLLM's administrative routes) and the metrics key
(`server.metrics_api_key`, which shows key names and usage in /metrics).

A key comes as `Authorization: Bearer <key>` (the scheme in any case, as vLLM 0.11+ reads it) or as `x-api-key: <key>`
(Anthropic's SDKs and Claude Code); only SHA-256 digests are kept, compared in constant time, every one of them, so
that the time taken says nothing about which matched. The lists are separate: a client key never opens an
administrative route, and an admin key is not a client key unless it is in both lists.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from proxy.errors import PermissionDenied, Unauthorized
from proxy.server.asgi import Scope
from proxy.settings.sections import KeySettings

REFUSED = Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).")
NOT_ADMIN = PermissionDenied(
    "This is one of vLLM's administrative routes: token-guard opens it only to a key of server.admin_api_keys."
)

KEY_HEADERS = (b"authorization", b"x-api-key")
KEY_SCOPE = "token_guard.key"  # the request's named key, for the handler


def named_key(scope: Scope) -> KeySettings | None:
    key: KeySettings | None = scope.get(KEY_SCOPE)
    return key


class ApiKeys:
    def __init__(
        self, api_keys: Iterable[str], named: Iterable[KeySettings] = (), admin: Iterable[str] = (),
        metrics: str | None = None,
    ) -> None:  # fmt: skip
        self._digests = [_digest(key) for key in api_keys]
        self._named = [(bytes.fromhex(key.key_sha256), key) for key in named]
        self._admin = [_digest(key) for key in admin]
        self._metrics = [_digest(metrics)] if metrics else []

    def __bool__(self) -> bool:
        """True when client keys are configured: then every client route needs one."""
        return bool(self._digests or self._named)

    def client(self, scope: Scope) -> bool:
        """True when the request may use a client route: no client keys are configured, or it carries one. A named
        key is put in the scope (KEY_SCOPE)."""
        if not self:
            return True
        given = given_key(scope)
        if given is None:
            return False
        return self._name(scope, given) | _any(given, self._digests)

    def admin(self, scope: Scope) -> bool:
        """True when the request carries a key of server.admin_api_keys (never when none is configured)."""
        given = given_key(scope)
        return given is not None and _any(given, self._admin)

    def metrics(self, scope: Scope) -> bool:
        """True when the request carries server.metrics_api_key: /metrics then shows key names and usage."""
        given = given_key(scope)
        return given is not None and _any(given, self._metrics)

    def _name(self, scope: Scope, given: bytes) -> bool:
        """Put the named key whose digest is `given` in the scope (KEY_SCOPE); false when there is none."""
        found = None
        for digest, key in self._named:
            if hmac.compare_digest(given, digest):
                found = key
        if found is not None:
            scope[KEY_SCOPE] = found
        return found is not None


def given_key(scope: Scope) -> bytes | None:
    """The SHA-256 of the key the request carries, if any."""
    headers = {name.lower(): value for name, value in scope["headers"] if name.lower() in KEY_HEADERS}
    scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer":
        if b"x-api-key" not in headers:
            return None
        token = headers[b"x-api-key"]
    return hashlib.sha256(token).digest()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _any(given: bytes, digests: list[bytes]) -> bool:
    matched = False
    for digest in digests:  # every key is compared, so the time taken says nothing about which matched
        matched |= hmac.compare_digest(given, digest)
    return matched

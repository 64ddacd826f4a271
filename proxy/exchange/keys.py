"""API keys, checked as each route of the table requires (api/routes.py): client keys (`server.api_keys`, and the named
keys of `[[keys]]`, whose settings the request carries on for its quotas),
admin keys (`server.admin_api_keys`, the only keys that reach vLLM's administrative routes) and the metrics key
(`server.metrics_api_key`); either of the last two shows key names, usage and models in /metrics and /health. Read
from a request's headers as every front end has them: (name, value) byte pairs, names in lower case.

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
from proxy.exchange.headers import RawHeaders
from proxy.settings.sections import KeySettings

REFUSED = Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).")
NOT_ADMIN = PermissionDenied(
    "This is one of vLLM's administrative routes: token-guard opens it only to a key of server.admin_api_keys."
)

KEY_HEADERS = (b"authorization", b"x-api-key")
ANONYMOUS = (True, None)  # a client route's answer for a request that may use it without a named key


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

    @property
    def any(self) -> bool:
        """True when the guard checks any key (client, admin or metrics): a key a client sends is then the guard's."""
        return bool(self._digests or self._named or self._admin or self._metrics)

    def client(self, headers: RawHeaders) -> tuple[bool, KeySettings | None]:
        """Whether the request may use a client route (no client keys are configured, or it carries one), and its
        named key ([[keys]]) if it carries one."""
        if not self:
            return ANONYMOUS
        given = given_key(headers)
        if given is None:
            return False, None
        named = self._named_key(given)
        return (named is not None) | _any(given, self._digests), named

    def admin(self, headers: RawHeaders) -> bool:
        """True when the request carries a key of server.admin_api_keys (never when none is configured)."""
        given = given_key(headers)
        return given is not None and _any(given, self._admin)

    def operator(self, headers: RawHeaders) -> bool:
        """True when the request carries server.metrics_api_key or a key of server.admin_api_keys: the guard's own
        /metrics and /health then show what only operators see (key names and usage, the models)."""
        given = given_key(headers)
        return given is not None and (_any(given, self._metrics) | _any(given, self._admin))

    def _named_key(self, given: bytes) -> KeySettings | None:
        """The named key whose digest is `given`, if any (every digest is compared)."""
        found = None
        for digest, key in self._named:
            if hmac.compare_digest(given, digest):
                found = key
        return found


def given_key(headers: RawHeaders) -> bytes | None:
    """The SHA-256 of the key the request carries, if any."""
    sent = {name.lower(): value for name, value in headers if name.lower() in KEY_HEADERS}
    scheme, _, token = sent.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer":
        if b"x-api-key" not in sent:
            return None
        token = sent[b"x-api-key"]
    return hashlib.sha256(token).digest()


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _any(given: bytes, digests: list[bytes]) -> bool:
    matched = False
    for digest in digests:  # every key is compared, so the time taken says nothing about which matched
        matched |= hmac.compare_digest(given, digest)
    return matched

"""API keys for the guard's own clients: when `server.api_keys` is set, `/v1/*` needs `Authorization: Bearer <key>`,
checked as vLLM 0.11+ checks it (scheme in any case, SHA-256 digests compared in constant time, several keys). The
key may also come as `x-api-key: <key>`, the header Anthropic's SDKs and Claude Code send. Named keys (`[[keys]]`,
given as the key or its SHA-256) are accepted too, and the request carries the key's settings on to the handler
(scope["token_guard.key"]) for its quotas. On the open routes (`/tokenize`, ...) no key is needed, but a named key
sent anyway is still recognised, so that the answer tells its quota.

The other prefixes vLLM 0.22+ protects (`/v2`, `/inference`, `/cohere`) are protected too: everything else is passed
through, with `upstream.api_key` put in, so leaving them open would open the upstream's protected routes to anyone.
`/invocations` (SageMaker) is protected too: vLLM leaves it open, but it generates like `/v1/chat/completions`; and so
are the pooling routes vLLM leaves open (`/pooling`, `/classify`, `/score`, `/rerank`), which run the model like
`/v1/embeddings`.
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
from collections.abc import Iterable

from proxy.errors import Unauthorized
from proxy.server.asgi import Scope
from proxy.settings.sections import KeySettings

PROTECTED = ("/v1", "/v2", "/inference", "/cohere", "/invocations", "/pooling", "/classify", "/score", "/rerank")
REFUSED = Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).")


KEY_HEADERS = (b"authorization", b"x-api-key")
KEY_SCOPE = "token_guard.key"  # the request's named key, for the handler


def named_key(scope: Scope) -> KeySettings | None:
    key: KeySettings | None = scope.get(KEY_SCOPE)
    return key


class ApiKeys:
    def __init__(self, api_keys: Iterable[str], named: Iterable[KeySettings] = ()) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in api_keys]
        self._named = [(bytes.fromhex(key.key_sha256), key) for key in named]

    def __bool__(self) -> bool:
        return bool(self._digests or self._named)

    def allows(self, scope: Scope) -> bool:
        """True when the request may pass: no keys are configured, its path is open, or it carries a valid key. A
        named key is put in the scope (KEY_SCOPE)."""
        if not self:
            return True
        if not _protected(scope):  # open to all; a named key sent anyway is still known, so its answer tells its quota
            if self._named and (sent := self._given(scope)) is not None:
                self._name(scope, sent)
            return True
        given = self._given(scope)
        if given is None:
            return False
        matched = False
        for digest in self._digests:  # every key is compared, so the time taken says nothing about which matched
            matched |= hmac.compare_digest(given, digest)
        return self._name(scope, given) or matched

    def _name(self, scope: Scope, given: bytes) -> bool:
        """Put the named key whose digest is `given` in the scope (KEY_SCOPE); false when there is none."""
        found = None
        for digest, key in self._named:
            if hmac.compare_digest(given, digest):
                found = key
        if found is not None:
            scope[KEY_SCOPE] = found
        return found is not None

    def _given(self, scope: Scope) -> bytes | None:
        """The SHA-256 of the key the request carries."""
        headers = {name.lower(): value for name, value in scope["headers"] if name.lower() in KEY_HEADERS}
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            if b"x-api-key" not in headers:
                return None
            token = headers[b"x-api-key"]
        return hashlib.sha256(token).digest()


def _protected(scope: Scope) -> bool:
    if scope["method"] == "OPTIONS":  # CORS preflight, as vLLM
        return False
    # Normalized so that `//v1/..`, `/x/../v1/..` or `/V1/..` cannot slip past on their way to a lenient upstream.
    path = posixpath.normpath("/" + scope["path"].removeprefix(scope.get("root_path", "")).lstrip("/")).lower()
    return any(path == prefix or path.startswith(prefix + "/") for prefix in PROTECTED)

"""API keys for the guard's own clients: when `server.api_keys` is set, `/v1/*` needs `Authorization: Bearer <key>`,
checked as vLLM 0.11+ checks it (scheme in any case, SHA-256 digests compared in constant time, several keys). The
key may also come as `x-api-key: <key>`, the header Anthropic's SDKs and Claude Code send.

The other prefixes vLLM 0.22+ protects (`/v2`, `/inference`, `/cohere`) are protected too: everything else is passed
through, with `upstream.api_key` put in, so leaving them open would open the upstream's protected routes to anyone.
`/invocations` (SageMaker) is protected too: vLLM leaves it open, but it generates like `/v1/chat/completions`.
"""

from __future__ import annotations

import hashlib
import hmac
import posixpath
from collections.abc import Iterable

from proxy.errors import Unauthorized
from proxy.server.asgi import Scope

PROTECTED = ("/v1", "/v2", "/inference", "/cohere", "/invocations")
REFUSED = Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).")


KEY_HEADERS = (b"authorization", b"x-api-key")


class ApiKeys:
    def __init__(self, api_keys: Iterable[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in api_keys]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def allows(self, scope: Scope) -> bool:
        """True when the request may pass: no keys are configured, its path is open, or it carries a valid key."""
        return not self._digests or not _protected(scope) or self._valid(scope)

    def _valid(self, scope: Scope) -> bool:
        headers = {name.lower(): value for name, value in scope["headers"] if name.lower() in KEY_HEADERS}
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() != b"bearer":
            if b"x-api-key" not in headers:
                return False
            token = headers[b"x-api-key"]
        given = hashlib.sha256(token).digest()
        matched = False
        for digest in self._digests:  # every key is compared, so the time taken says nothing about which matched
            matched |= hmac.compare_digest(given, digest)
        return matched


def _protected(scope: Scope) -> bool:
    if scope["method"] == "OPTIONS":  # CORS preflight, as vLLM
        return False
    # Normalized so that `//v1/..`, `/x/../v1/..` or `/V1/..` cannot slip past on their way to a lenient upstream.
    path = posixpath.normpath("/" + scope["path"].removeprefix(scope.get("root_path", "")).lstrip("/")).lower()
    return any(path == prefix or path.startswith(prefix + "/") for prefix in PROTECTED)

"""API keys for the guard's own clients: when `server.api_keys` is set, `/v1/*` needs `Authorization: Bearer <key>`,
checked as vLLM 0.11+ checks it (scheme in any case, SHA-256 digests compared in constant time, several keys).

The other prefixes vLLM 0.22+ protects (`/v2`, `/inference`, `/cohere`) are protected too: everything else is passed
through, with `upstream.api_key` put in, so leaving them open would open the upstream's protected routes to anyone.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import posixpath
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import Unauthorized
from proxy.server.record import REQUEST_ID, request_id
from proxy.server.responses import error_response

log = logging.getLogger("token_guard.auth")

PROTECTED = ("/v1", "/v2", "/inference", "/cohere")


class ApiKeyAuth:
    def __init__(self, app: ASGIApp, api_keys: Iterable[str]) -> None:
        self.app = app
        self._digests = [hashlib.sha256(key.encode()).digest() for key in api_keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._digests or not _protected(scope) or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        rid = request_id(Headers(scope=scope).get(REQUEST_ID))
        log.info("401 for %s %s: no valid API key (request %s)", scope["method"], scope["path"], rid)
        error = Unauthorized("Invalid or missing API key: send `Authorization: Bearer <key>`.")
        headers = {"www-authenticate": "Bearer", REQUEST_ID: rid}
        await error_response(error, headers)(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        header = next((value for name, value in scope["headers"] if name.lower() == b"authorization"), b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
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

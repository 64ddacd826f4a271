"""The body-size limit: a body above `server.max_body_bytes` gets a 413 without being read whole.

A declared Content-Length over the limit is refused before a byte of the body is read. A chunked body is counted as
it arrives; the read that passes the limit raises `PayloadTooLarge`, which the route's error boundary turns into the
413, and nothing more is read (the server discards the rest of the upload without keeping it).
"""

from __future__ import annotations

import logging

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.errors import PayloadTooLarge
from proxy.server.record import REQUEST_ID, request_id
from proxy.server.responses import error_response

log = logging.getLogger("token_guard.limits")


class BodyLimit:
    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            rid = request_id(headers.get(REQUEST_ID))
            log.info("413 for %s %s: Content-Length %s (request %s)", scope["method"], scope["path"], declared, rid)
            error = too_large(self.max_body_bytes)
            await error_response(error, {REQUEST_ID: rid})(scope, receive, send)
            return
        await self.app(scope, counting(receive, self.max_body_bytes), send)


def counting(receive: Receive, limit: int) -> Receive:
    """`receive` that raises `PayloadTooLarge` instead of handing over the chunk that takes the body past `limit`."""
    seen = 0

    async def receive_counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise too_large(limit)
        return message

    return receive_counted


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes (server.max_body_bytes).")

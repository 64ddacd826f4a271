"""Keep the upstream's internals out of the guard's answers: a 5xx whose body carries a Python traceback or file
paths, or was too large to read whole, is replaced by a generic error in the OpenAI envelope, with the same status."""

from __future__ import annotations

import re

from proxy.errors import GuardError

_LEAK = re.compile(
    rb"Traceback \(most recent call last\)"
    rb'|File \\?"[^"\n]+", line \d+'  # a traceback frame, also inside a JSON string
    rb"|(?<![\w:/.~-])/(?:[\w.@+~-]+/)+[\w.@+~-]+"  # /usr/lib/python3.12/site-packages/vllm/engine.py, not URLs
    rb"|\b[A-Za-z]:\\+[\w.-]"  # C:\Users, also JSON-escaped
)
_TYPES = {
    501: "NotImplementedError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


def sanitize_upstream_error(status: int, content_type: str, body: bytes, cut: bool = False) -> bytes | None:
    """The body to send instead of the upstream's, or None to send the upstream's unchanged. `cut`: `body` is only
    the beginning of the upstream's."""
    if status < 500 or content_type.startswith("text/event-stream") or not (cut or _LEAK.search(body)):
        return None
    error = GuardError(
        f"The upstream failed with an internal error (HTTP {status}); the details are in token-guard's log.",
        code=status,
    )
    error.error_type = _TYPES.get(status, "InternalServerError")
    return error.json_bytes()

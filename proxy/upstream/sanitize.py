"""Keep the upstream's internals out of the guard's answers: a 5xx whose body carries a Python traceback or file
paths, or was too large to read whole, is told to the client as the guard's own error instead, with the same
status."""

from __future__ import annotations

import re

from proxy import error_bodies
from proxy.errors import UpstreamFailed

_LEAK = re.compile(
    rb"Traceback \(most recent call last\)"
    rb'|File \\?"[^"\n]+", line \d+'  # a traceback frame, also inside a JSON string
    rb"|(?<![\w:/.~-])/(?:[\w.@+~-]+/)+[\w.@+~-]+"  # /usr/lib/python3.12/site-packages/vllm/engine.py, not URLs
    rb"|\b[A-Za-z]:\\+[\w.-]"  # C:\Users, also JSON-escaped
)


def withheld(status: int, content_type: str, body: bytes, cut: bool = False) -> UpstreamFailed | None:
    """The error to tell instead of the upstream's answer, or None to relay the upstream's unchanged. `cut`: `body`
    is only the beginning of the upstream's."""
    if status < 500 or content_type.startswith("text/event-stream") or not (cut or _LEAK.search(body)):
        return None
    return UpstreamFailed(
        f"The upstream failed with an internal error (HTTP {status}); the details are in token-guard's log.", status
    )


def sanitize_upstream_error(status: int, content_type: str, body: bytes, cut: bool = False) -> bytes | None:
    """The body to send instead of the upstream's (OpenAI's envelope), or None to send the upstream's unchanged."""
    error = withheld(status, content_type, body, cut)
    return None if error is None else error_bodies.json_bytes(error)

"""The guard's own probes and metrics (the route table's OWN routes), answered by either front end itself, never by
vLLM: /livez (the process serves), /health and /ping (ready: the models known, an upstream replica answering), and
/metrics; what /health and /metrics show depends on who asks (Core.sight)."""

from __future__ import annotations

import json

from proxy.exchange.core import Core
from proxy.exchange.headers import RawHeaders

JSON_TYPE = b"application/json"
METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
ALIVE = b'{"status":"alive"}'


async def own_answer(core: Core, path: str, headers: RawHeaders) -> tuple[int, bytes, bytes]:
    """The answer to the OWN route at `path` asked with `headers`: its status, content type and body."""
    if path == "/metrics":
        return 200, METRICS_TYPE, core.exposition(headers)
    if path == "/livez":
        return 200, JSON_TYPE, ALIVE
    status, body = await core.readiness(core.sight(headers)[1])
    return status, JSON_TYPE, json.dumps(body).encode()

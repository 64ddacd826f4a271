"""The headers the guard sends upstream: never the hop-by-hop ones, and with `upstream.api_key` set, the guard's own
key in place of whatever `Authorization` the client sent (the client's key is for the guard, not for vLLM)."""

from __future__ import annotations

from collections.abc import Mapping

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers without the hop-by-hop ones (also those its Connection header names)."""
    dropped = HOP_BY_HOP.union(h.strip().lower() for h in headers.get("connection", "").split(","))
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def outgoing(headers: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """`headers` (already stripped of hop-by-hop ones) as they go upstream."""
    if api_key is None:
        return dict(headers)
    # x-api-key too: Anthropic clients send the guard's key there (server/auth.py)
    kept = {name: value for name, value in headers.items() if name.lower() not in ("authorization", "x-api-key")}
    return {**kept, **upstream_auth(api_key)}


def upstream_auth(api_key: str | None) -> dict[str, str]:
    """The header for the guard's own calls upstream (/v1/models discovery, /health, /tokenize, /metrics)."""
    return {} if api_key is None else {"authorization": f"Bearer {api_key}"}

"""The headers the guard sends upstream: with `upstream.api_key` set, the guard's own key replaces whatever
`Authorization` the client sent (the client's key is for the guard, not for vLLM)."""

from __future__ import annotations

from collections.abc import Mapping


def outgoing(headers: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """`headers` (already stripped of hop-by-hop ones) as they go upstream."""
    if api_key is None:
        return dict(headers)
    kept = {name: value for name, value in headers.items() if name.lower() != "authorization"}
    return {**kept, **upstream_auth(api_key)}


def upstream_auth(api_key: str | None) -> dict[str, str]:
    """The header for the guard's own calls upstream (/v1/models discovery, /health, /tokenize, /metrics)."""
    return {} if api_key is None else {"authorization": f"Bearer {api_key}"}

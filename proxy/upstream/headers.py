"""The headers the guard sends upstream: never the hop-by-hop ones, and never a client's credentials where the guard
checks keys or holds one of its own (`upstream.api_key`). One rule for both front ends: serve applies it to the
headers it sends, extproc as Envoy's header mutation (`Credentials`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
CREDENTIAL_HEADERS = ("authorization", "x-api-key")  # x-api-key too: Anthropic clients send the guard's key there


@dataclass(frozen=True, slots=True)
class Credentials:
    """What becomes of a request's credentials on the way upstream: the client's `removed`, the guard's `added`."""

    removed: tuple[str, ...] = ()
    added: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, api_key: str | None, checks_keys: bool) -> Credentials:
        """`api_key`: upstream.api_key, which replaces the client's credentials. `checks_keys`: the guard checks keys
        (client, admin or metrics keys are configured): the client's are then the guard's, never vLLM's, and are
        removed. Neither: the guard checks no key and the client's go on untouched, for vLLM's own --api-key."""
        if api_key is None and not checks_keys:
            return cls()
        return cls(CREDENTIAL_HEADERS, upstream_auth(api_key))


def forwardable(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers without the hop-by-hop ones (also those its Connection header names)."""
    dropped = HOP_BY_HOP.union(h.strip().lower() for h in headers.get("connection", "").split(","))
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def outgoing(headers: Mapping[str, str], credentials: Credentials) -> dict[str, str]:
    """`headers` (already stripped of hop-by-hop ones) as they go upstream."""
    if not credentials.removed:
        return dict(headers)
    kept = {name: value for name, value in headers.items() if name.lower() not in credentials.removed}
    return {**kept, **credentials.added}


def upstream_auth(api_key: str | None) -> dict[str, str]:
    """The header for the guard's own calls upstream (/v1/models discovery, /health, /tokenize, /metrics)."""
    return {} if api_key is None else {"authorization": f"Bearer {api_key}"}

"""Which replica's budget a request behind the Gateway API Inference Extension's endpoint picker is admitted on. The
picker (an ext_proc server itself) names the pod it chose in `x-gateway-destination-endpoint: ip:port`; when the
guard runs after it, admission charges that replica's budget (the one of upstream.urls with that host and port),
and when it runs before it (no header yet), or the endpoint is not one of upstream.urls, the whole pool's: the replica
with the fewest tokens in flight that fits, as serve picks one."""

from __future__ import annotations

from urllib.parse import urlsplit

from proxy.exchange.headers import RawHeaders

DESTINATION = b"x-gateway-destination-endpoint"
POOL: frozenset[int] = frozenset()  # no replica excluded


class Endpoints:
    def __init__(self, urls: tuple[str, ...]) -> None:
        self._index = {_address(url): i for i, url in enumerate(urls)}
        self._others = {i: frozenset(range(len(urls))) - {i} for i in range(len(urls))}

    def excluded(self, headers: RawHeaders) -> frozenset[int]:
        """The replicas the request may not be admitted on: all but the picker's choice, when there is one."""
        chosen = next((v for k, v in headers if k == DESTINATION), None)
        if chosen is None:
            return POOL
        index = self._index.get(chosen.split(b",", 1)[0].strip().decode("latin-1").lower())
        return POOL if index is None else self._others[index]


def _address(url: str) -> str:
    parts = urlsplit(url)
    host, port = (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

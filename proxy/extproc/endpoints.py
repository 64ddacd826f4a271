"""Which replica's budget a request behind the Gateway API Inference Extension's endpoint picker is admitted on. The
picker (an ext_proc server itself) names the pod it chose in `x-gateway-destination-endpoint: ip:port`. Where the
deployment says the picker runs before the guard and sets it (extproc.picker_sets_destination), admission charges
that replica's budget (the one of upstream.urls with that address: as written, or as its host name resolves, e.g. a
StatefulSet's headless Service); otherwise the header can only be the client's, and is ignored (gateway.py removes
it before the upstream). Without a trusted header, or when the endpoint is not one of upstream.urls, the whole
pool's: the replica with the fewest tokens in flight that fits, as serve picks one."""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlsplit

from proxy.exchange.headers import Headers, RawHeaders
from proxy.exchange.stored import Recorder

DESTINATION = b"x-gateway-destination-endpoint"
POOL: frozenset[int] = frozenset()  # no replica excluded
RESOLVE_EVERY_S = 5.0  # an endpoint not known is looked up again at most this often (pods come and go)


class Endpoints:
    def __init__(self, urls: tuple[str, ...], trusted: bool) -> None:
        """`trusted`: the header is the picker's (it runs before the guard); otherwise it is ignored."""
        self.trusted, self.urls = trusted, urls
        self._replicas = [_host_port(url) for url in urls]
        self._index = {_address(host, port): i for i, (host, port) in enumerate(self._replicas)}
        self._others = {i: frozenset(range(len(urls))) - {i} for i in range(len(urls))}
        self._resolved = -RESOLVE_EVERY_S

    def pinned(self, url: str) -> tuple[frozenset[int], bytes] | None:
        """For a request that must reach the replica at `url` (it holds a stored response), where the picker's
        header routes the request (trusted): the replicas it may not be admitted on, and the header's new value;
        None where the processor does not choose the replica."""
        if not self.trusted or url not in self.urls:
            return None
        index = self.urls.index(url)
        return self._others[index], _address(*self._replicas[index]).encode("latin-1")

    def pinning(self, url: str | None) -> Headers:
        """The header that sends a request to the replica at `url` (a stored response's), where the processor routes
        it (Endpoints.pinned); none otherwise."""
        pinned = self.pinned(url) if url is not None else None
        return [(DESTINATION, pinned[1])] if pinned is not None else []

    async def placed(self, recorder: Recorder | None, headers: RawHeaders) -> tuple[frozenset[int], Headers]:
        """The replicas a forwarded request may not be admitted on, and the headers that send it to the replica that
        holds the stored response it continues (`recorder`'s), where the picker's header routes it; the replica its
        answer is recorded for, set on the recorder."""
        if recorder is None:
            return await self.excluded(headers), []
        pinned = self.pinned(recorder.replica) if recorder.replica is not None else None
        if pinned is not None:
            recorder.url = recorder.replica or ""
            return pinned[0], [(DESTINATION, pinned[1])]
        recorder.url = await self.chosen(headers) or ""
        return await self.excluded(headers), []

    async def chosen(self, headers: RawHeaders) -> str | None:
        """The URL of the replica the picker named (trusted only), for the ledger to record; None when not known."""
        index = await self._named(headers)
        return None if index is None else self.urls[index]

    async def excluded(self, headers: RawHeaders) -> frozenset[int]:
        """The replicas the request may not be admitted on: all but the picker's choice, when there is one."""
        index = await self._named(headers)
        return POOL if index is None else self._others[index]

    async def _named(self, headers: RawHeaders) -> int | None:
        if not self.trusted:
            return None
        chosen = next((v for k, v in headers if k == DESTINATION), None)
        if chosen is None:
            return None
        address = chosen.split(b",", 1)[0].strip().decode("latin-1").lower()
        index = self._index.get(address)
        if index is None and time.monotonic() - self._resolved > RESOLVE_EVERY_S:
            await self._resolve()
            index = self._index.get(address)
        return index

    async def _resolve(self) -> None:
        """Index the replicas by the addresses their host names resolve to now."""
        self._resolved = time.monotonic()
        loop = asyncio.get_running_loop()
        for i, (host, port) in enumerate(self._replicas):
            try:
                found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                continue
            for *_, sockaddr in found:
                self._index[_address(str(sockaddr[0]), port)] = i


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

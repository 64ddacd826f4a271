"""What the processor knows of the gateway it serves, decided once from the settings: what it changes in a forwarded
request's headers, the same for every request (the client's credentials, as serve's rule has them; a client's
x-gateway-destination-endpoint where no endpoint picker before the guard sets it), the path prefixes it takes off
itself (`:path` rewritten, so that the path it guards is the one vLLM receives), and which replica's budget a request
is admitted on (endpoints.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proxy.exchange.core import Core
from proxy.exchange.headers import Headers, encode_headers
from proxy.extproc.endpoints import DESTINATION, Endpoints

log = logging.getLogger("token_guard.extproc")


@dataclass(frozen=True, slots=True)
class Upward:
    """A forwarded request's header changes: `set` replaces or adds, `removed` takes off."""

    set: Headers
    removed: tuple[str, ...]


class Gateway:
    def __init__(self, core: Core) -> None:
        settings = core.settings.extproc
        trusted = settings.picker_sets_destination
        self.endpoints = Endpoints(core.settings.upstream.urls, trusted)
        self.prefixes = tuple(prefix.encode("latin-1") for prefix in settings.path_prefixes)
        removed = core.credentials.removed if trusted else (*core.credentials.removed, DESTINATION.decode())
        self._added = encode_headers(core.credentials.added)
        self.fixed = Upward(self._added, removed)  # a request whose path stays as sent
        self.read_timeout_s = core.settings.server.read_timeout_s  # a guarded body must have come within it
        for prefix in settings.path_prefixes:
            for route in core.routes.routes():
                if route.path.startswith(prefix + "/"):
                    log.warning("extproc.path_prefixes: %s is taken off %s too, which cannot then be reached", prefix,
                                route.path)  # fmt: skip

    def unprefixed(self, raw_path: bytes) -> bytes | None:
        """`raw_path` without the prefix of extproc.path_prefixes it starts with (whole segments), None when it starts
        with none. Matched as sent, before any percent-decoding, as Envoy's route matched it."""
        for prefix in self.prefixes:
            if raw_path.startswith(prefix) and raw_path[len(prefix) : len(prefix) + 1] == b"/":
                return raw_path[len(prefix) :]
        return None

    def upward(self, target: bytes | None) -> Upward:
        """The header changes of a request whose `:path` becomes `target` (None: it stays as sent)."""
        if target is None:
            return self.fixed
        return Upward([*self._added, (b":path", target)], self.fixed.removed)

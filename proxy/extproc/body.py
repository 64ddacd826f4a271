"""A guarded request's body as Envoy sends it to the processor: gathered whole before the guard decides, at most
server.max_body_bytes (413), within its share of the bodies held at once (exchange/bodies.py: 503), and by
server.read_timeout_s after its headers (408), as serve reads one."""

from __future__ import annotations

import asyncio

from proxy.errors import PayloadTooLarge, RequestTimeout
from proxy.exchange.bodies import Held


class Gathered:
    def __init__(self, held: Held, max_body_bytes: int, read_timeout_s: float) -> None:
        self.held, self.max_body_bytes, self.read_timeout_s = held, max_body_bytes, read_timeout_s
        self.pending = False  # a guarded request whose body is still to come and be decided
        self.deadline: float | None = None  # by when (the loop's clock) that body must have come
        self.pieces: list[bytes] = []
        self.size = 0

    def check(self, declared: bytes) -> None:
        """The body's declared length (`content-length`, b"" when none), refused before Envoy sends a byte of it."""
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise PayloadTooLarge.over(self.max_body_bytes)
        if declared.isdigit():  # a 503 when those held at once leave it no room
            self.held.check(int(declared))

    def expect(self) -> None:
        """The body is to come, by its deadline."""
        self.pending, self.deadline = True, asyncio.get_running_loop().time() + self.read_timeout_s

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.max_body_bytes:
            raise PayloadTooLarge.over(self.max_body_bytes)
        self.held.grow(self.size)
        self.pieces.append(piece)

    def take(self) -> bytes:
        """The whole body, once it has come: no longer pending."""
        body, self.pieces = b"".join(self.pieces), []
        self.pending, self.deadline = False, None
        return body

    def late(self) -> RequestTimeout:
        return RequestTimeout(f"The request body did not arrive within {self.read_timeout_s:g} s "
                              f"(server.read_timeout_s); got {self.size} bytes.")  # fmt: skip

"""The request bodies a process holds at once, across all its requests (server.max_held_body_bytes): a body holds the
bytes that have arrived of it and gives them back when its request is done. One that does not fit is answered 503
with Retry-After: before a byte of it is read when its declared length does not fit beside the bodies held now, else
at the piece that would take the process past its bound. Many uploads at once can no longer take the guard's memory,
each within server.max_body_bytes as it may be.

A body holds what arrived, not what it declared: a client that declares 32 MiB and sends a byte a second holds a
byte, not the room of every other upload for server.read_timeout_s."""

from __future__ import annotations

from proxy.errors import GuardUnavailable

RETRY_AFTER_S = 1  # a body's bytes come back as soon as its request is done: most within a second


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes of the bodies being read or decided, until their requests are done

    def hold(self) -> Held:
        """One request's share, empty until its body comes."""
        return Held(self)


class Held:
    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget, self.size = budget, 0

    def check(self, declared: int) -> None:
        """A 503 before a byte is read when a body of its `declared` length does not fit beside the bodies held now;
        holds nothing (its bytes are held as they arrive)."""
        if self.budget.held - self.size + declared > self.budget.limit:
            raise self._full()

    def grow(self, size: int) -> None:
        """Hold `size` bytes in all for this request (what has arrived of its body so far); a 503 when the process
        holds too much to take them."""
        more = size - self.size
        if more <= 0:
            return
        budget = self.budget
        if budget.held + more > budget.limit:
            raise self._full()
        budget.held += more
        self.size = size

    def release(self) -> None:
        self.budget.held -= self.size
        self.size = 0

    def _full(self) -> GuardUnavailable:
        return GuardUnavailable(f"token-guard holds as many request bodies as it may at once ({self.budget.limit} "
                                "bytes, server.max_held_body_bytes); send the request again shortly.", RETRY_AFTER_S,
                                "server_busy")  # fmt: skip

"""The request bodies a process holds at once, across all its requests (server.max_held_body_bytes): a body takes
its share before its first byte is read (its declared length, or its bytes as they arrive when it has none) and
gives it back when its request is done. One that does not fit is answered 503 with Retry-After, unread: many
uploads at once can no longer take the guard's memory, each within server.max_body_bytes as it may be."""

from __future__ import annotations

from proxy.errors import GuardUnavailable

RETRY_AFTER_S = 1  # a body's bytes come back as soon as its request is done: most within a second


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes of the bodies admitted, until their requests are done

    def hold(self) -> Held:
        """One request's share, empty until its body comes."""
        return Held(self)


class Held:
    __slots__ = ("budget", "size")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget, self.size = budget, 0

    def grow(self, size: int) -> None:
        """Hold `size` bytes in all for this request (its declared length, or what has arrived so far); a 503 when
        the process holds too much to take them."""
        more = size - self.size
        if more <= 0:
            return
        budget = self.budget
        if budget.held + more > budget.limit:
            raise GuardUnavailable(f"token-guard holds as many request bodies as it may at once ({budget.limit} "
                                   "bytes, server.max_held_body_bytes); send the request again shortly.",
                                   RETRY_AFTER_S, "server_busy")  # fmt: skip
        budget.held += more
        self.size = size

    def release(self) -> None:
        self.budget.held -= self.size
        self.size = 0

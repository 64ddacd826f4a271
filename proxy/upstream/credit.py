"""Credit in blocks, the bookkeeping without Redis: with a fleet budget (redis.url), each process holds a
block of each replica's budget (tokens and request slots, reserved in Redis under its own lease) and admits a request
that fits in what the block has unused at once, with no round trip. What the block should be is decided here: a
bounded share of the whole budget while requests come, only what runs when the process is idle or others want
budget, nothing when nothing runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.upstream.admission import Budget

IDLE_S = 1.0  # a block not drawn on for this long goes back (all but what still runs on it)
WANTED_S = 0.3  # how long word that others want budget holds here (the holder asks again sooner while it holds)

Size = tuple[int, int]  # tokens, request slots


def block_size(whole: Budget, share: float, instances: int) -> Size:
    """The block each process may hold on a replica: `share` of its whole budget over the processes sharing it;
    (0, 0) when that is not one slot, nor one token under a token budget, or when the replica has no budget.
    Without a request budget a block holds one slot: it marks the replica busy (an oversized request waits for it)."""
    if not (whole.max_tokens or whole.max_requests):
        return 0, 0
    part = share / max(1, instances)
    tokens = int(whole.max_tokens * part)
    slots = int(whole.max_requests * part) if whole.max_requests else 1
    if slots < 1 or (whole.max_tokens and tokens < 1):
        return 0, 0
    return tokens, slots


@dataclass
class Block:
    """One replica's block in this process: what it holds in Redis, and what of it runs now."""

    tokens: int = 0
    slots: int = 0
    used_tokens: int = 0
    used_slots: int = 0
    drawn_at: float = float("-inf")  # when a request last drew on it, or wished it could (monotonic)
    wanted_until: float = float("-inf")  # others want budget (a reservation fit nowhere): give back, take no more

    @property
    def held(self) -> bool:
        return self.slots > 0

    def wanted(self, now: float) -> bool:
        return now < self.wanted_until

    def fits(self, cost: int, whole: Budget, now: float) -> bool:
        if not self.held or self.wanted(now):
            return False
        if whole.max_requests and self.used_slots >= self.slots:
            return False
        return not whole.max_tokens or self.used_tokens + cost <= self.tokens

    def take(self, cost: int, now: float) -> None:
        self.used_tokens += cost
        self.used_slots += 1
        self.drawn_at = now

    def give(self, cost: int) -> None:
        self.used_tokens -= cost
        self.used_slots -= 1

    def wish(self, size: Size, now: float) -> Size:
        """What it should hold: `size` (at least what runs on it) while requests draw on it and nobody else wants
        budget; else only what runs on it."""
        if self.wanted(now) or now - self.drawn_at >= IDLE_S or size == (0, 0):
            return self.used_tokens, self.used_slots
        return max(size[0], self.used_tokens), max(size[1], self.used_slots)

    def shrink(self, size: Size) -> None:
        """Admit on no more than `size` from now on (before asking Redis for it: nothing given back is taken
        while the answer comes)."""
        self.tokens, self.slots = min(self.tokens, size[0]), min(self.slots, size[1])

    def holds(self, size: Size, wanted: bool, now: float) -> None:
        """What Redis says it holds now, and whether others want budget."""
        self.tokens, self.slots = size
        self.wanted_until = now + WANTED_S if wanted else float("-inf")


def pick(blocks: Sequence[Block], wholes: Sequence[Budget], cost: int, allowed: Sequence[int], turn: int,
         now: float) -> int | None:  # fmt: skip
    """The replica whose block holds `cost`, with the fewest of this process's tokens running on it; ties go round
    from `turn`."""
    fitting = [i for i in allowed if blocks[i].fits(cost, wholes[i], now)]
    count = len(blocks)
    return min(fitting, key=lambda i: (blocks[i].used_tokens, (i - turn) % count), default=None)

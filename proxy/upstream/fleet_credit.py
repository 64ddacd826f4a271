"""This process's credit in the fleet's budget (redis.url): a request that fits in a block it holds is
admitted at once, with no round trip to Redis; in the background the blocks are kept at what they should hold
(proxy/upstream/credit.py decides), their leases renewed, and Redis asked on a short timer whether others want
budget, in which case what is unused goes back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from proxy.errors import FleetStateUnavailable
from proxy.fleet.budget import FleetBudget
from proxy.fleet.presence import Presence
from proxy.upstream.admission import Admission, Budget, Ticket
from proxy.upstream.credit import Block, Size, block_size, pick

log = logging.getLogger("token_guard.admission")

CHECK_S = 0.05  # how often a process holding credit asks whether others want budget (and renews the blocks' leases)


class FleetCredit:
    def __init__(
        self, budget: FleetBudget, presence: Presence, local: Admission, urls: Sequence[str],
        whole: Sequence[Budget], share: float, seen: dict[str, int],
    ) -> None:  # fmt: skip
        """`share`: of each replica's `whole` budget, what the processes' blocks may hold together; `seen`: each
        replica's tokens in flight across guards, updated as Redis answers."""
        self.budget, self.presence, self.local = budget, presence, local
        self.urls, self.whole, self.share, self.seen = list(urls), list(whole), share, seen
        self.blocks = [Block() for _ in self.urls]
        self.admitted = 0  # requests admitted on credit (token_guard_admission_credit_total)
        self._due = asyncio.Event()
        self._turn = 0
        self._outages = 0  # the link's, as of Redis's last word on the blocks: an outage since voids them
        self._unsure = False  # a call about the blocks failed: Redis may hold them still, so it is told again

    @property
    def block_id(self) -> str:
        return f"{self.presence.instance}:block"

    def admit(self, cost: int, exclude: frozenset[int]) -> Ticket | None:
        """A ticket on a block that holds `cost`, or None (and a block that could have held it is asked for)."""
        if self.budget.link.outages != self._outages:  # Redis may have lost them (a restart): ask it again first
            self.forget()
            self._due.set()
            return None
        allowed = [i for i in range(len(self.urls)) if i not in exclude and self.local.budgets[i].available]
        now = time.monotonic()
        replica = pick(self.blocks, self.whole, cost, allowed, self._turn, now)
        if replica is None:
            for i in allowed:
                self._missed(i, cost, now)
            return None
        self._turn = (replica + 1) % len(self.urls)
        self.blocks[replica].take(cost, now)
        self.admitted += 1
        return self.local.hold(replica, cost, credit=True)

    def give(self, ticket: Ticket) -> None:
        block = self.blocks[ticket.replica]
        block.give(ticket.cost)
        if block.wanted(time.monotonic()):  # others wait: what it ran on goes back now
            self._due.set()

    def forget(self) -> None:
        """Redis may have lost the blocks (it went away), or kept them (a call that ran out of time): admit on none
        until it answers for them again, and tell it what they should be then."""
        self._unsure = True
        for block in self.blocks:
            block.holds((0, 0), False, time.monotonic())

    async def run(self) -> None:
        """Tend the blocks when asked to, and while any is held (or may be), every CHECK_S."""
        while True:
            held = self._unsure or any(block.held for block in self.blocks)
            try:
                async with asyncio.timeout(CHECK_S if held else None):
                    await self._due.wait()
            except TimeoutError:
                pass
            self._due.clear()
            try:
                await self.tend()
            except FleetStateUnavailable:
                self.forget()
            except Exception:  # a bug must not stop the tending: without it, blocks are neither renewed nor returned
                log.exception("fleet admission: unexpected error tending the credit; it goes on")
                self.forget()

    async def tend(self) -> None:
        """One pass: each block resized towards what it should hold. Raises FleetStateUnavailable."""
        outages, unsure, self._unsure = self.budget.link.outages, self._unsure, False  # a failure forgets again
        for replica, block in enumerate(self.blocks):
            wish = block.wish(self._size(replica), time.monotonic())
            if not block.held and wish == (0, 0) and not unsure:
                continue
            block.shrink(wish)
            whole = self.whole[replica]
            size, wanted, tokens = await self.budget.adjust(
                (self.urls[replica], whole.max_tokens, whole.max_requests), self.block_id, wish
            )
            now = time.monotonic()
            block.holds(size, wanted, now)
            self.seen[self.urls[replica]] = tokens
            if wanted and block.wish(size, now) != size:
                self._due.set()  # others want budget: what is unused goes back at once
        self._outages = outages

    async def aclose(self) -> None:
        """Give every block back. Raises FleetStateUnavailable (their leases free them then)."""
        held = [replica for replica, block in enumerate(self.blocks) if block.held or self._unsure]
        self.forget()
        for replica in held:
            await self.budget.release(self.urls[replica], [self.block_id])

    def _missed(self, replica: int, cost: int, now: float) -> None:
        block, size = self.blocks[replica], self._size(replica)
        if size == (0, 0) or (self.whole[replica].max_tokens and cost > size[0]) or block.wanted(now):
            return  # no block would hold it (an oversized request takes the round trip, as it runs alone)
        block.drawn_at = now  # demand: keep the block, or take one
        if (block.tokens, block.slots) != block.wish(size, now):
            self._due.set()

    def _size(self, replica: int) -> Size:
        return block_size(self.whole[replica], self.share, self.presence.alive)

"""Heavy requests take turns with everything else on the event loop.

asyncio runs every callback that is ready in one turn of the loop before it polls its sockets again. When hundreds of
large prompts arrive together, each one's counting (milliseconds of work that holds the loop) lands in the same turn,
and the turn lasts seconds: a client's disconnect, a /health probe and every small request wait behind all of them.
The turnstile lets at most `per_turn` heavy requests start their work per turn of the loop; the others wait for the
following turns, so the loop polls its sockets between them. A request whose client leaves while it waits is
cancelled there, before any of its work is done.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Turnstile:
    def __init__(self, per_turn: int = 2) -> None:
        self.per_turn = per_turn
        self._used = 0  # heavy requests started in this turn
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._next_turn: asyncio.Handle | None = None

    async def enter(self) -> None:
        """Returns at once while this turn has room and nobody waits; else in a later turn, in arrival order."""
        if self._used < self.per_turn and not self._waiting:
            self._used += 1
            self._schedule()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._schedule()
        await waiter  # cancelled with its request when the client leaves: it is skipped below

    def _schedule(self) -> None:
        if self._next_turn is None:
            self._next_turn = asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        """Runs once in each turn of the loop while there is demand: a fresh allowance, given to the first waiters."""
        self._next_turn = None
        self._used = 0
        while self._waiting and self._used < self.per_turn:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._used += 1
        if self._waiting or self._used:
            self._schedule()

"""Token-budget admission: admit work by its real KV cost so that bursts of long requests wait at the door instead
of driving vLLM into preemption.

A request costs (prompt tokens + effective max_tokens) * n while it runs. Each replica has its own budget (tokens
and/or requests). A request goes to the replica with the fewest in-flight tokens that can take it; when none can,
it waits in one FIFO queue. It gets 429 when the queue is full or its wait reaches the timeout, with a Retry-After
estimated from how fast budget has been freed lately. A request that alone exceeds a budget is admitted to an idle
replica rather than waiting forever.
"""

from __future__ import annotations

import asyncio
import collections
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from proxy.errors import TooBusy

T = TypeVar("T")

RATE_WINDOW_S = 60.0


@dataclass
class Budget:
    max_tokens: int = 0  # 0: no token budget
    max_requests: int = 0  # 0: no request budget
    tokens: int = 0
    requests: int = 0
    available: bool = True  # false while the replica is taken out by health checks

    def fits(self, cost: int) -> bool:
        if not self.available:
            return False
        if self.max_requests and self.requests >= self.max_requests:
            return False
        alone = self.requests == 0  # an oversized request still runs, alone
        return not self.max_tokens or self.tokens + cost <= self.max_tokens or alone


@dataclass(eq=False)
class Ticket:
    replica: int
    cost: int
    waited_s: float
    released: bool = False
    lease: str | None = None  # its reservation in the fleet's budget (redis.url), if it holds one
    credit: bool = False  # admitted on this process's block of the fleet's budget (proxy/upstream/credit.py)


@dataclass(eq=False)
class _Waiter:
    cost: int
    exclude: frozenset[int]
    future: asyncio.Future[int] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Admission:
    def __init__(self, budgets: list[Budget], queue_timeout_s: float, max_queue: int) -> None:
        self.budgets = budgets
        self.queue_timeout_s = queue_timeout_s
        self.max_queue = max_queue
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._freed: collections.deque[tuple[float, int]] = collections.deque()  # (when, tokens) released lately
        self._freed_tokens = 0  # their sum
        self._turn = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def try_acquire(self, cost: int, exclude: frozenset[int] = frozenset()) -> Ticket | None:
        """A ticket at once when the request fits and nobody waits (no coroutine, no await: the common case)."""
        replica = self._pick(cost, exclude) if not self._queue else None
        if replica is None:
            return None
        self._reserve(replica, cost)
        return Ticket(replica, cost, 0.0)

    def hold(self, replica: int, cost: int, lease: str | None = None, credit: bool = False) -> Ticket:
        """A ticket for a request the fleet's budget admitted (by a reservation, or on credit): counted here too,
        unchecked, so that this process's in-flight tokens stay known and its own share stays honest if it must fall
        back on it."""
        self._reserve(replica, cost)
        return Ticket(replica, cost, 0.0, lease=lease, credit=credit)

    async def acquire(self, cost: int, exclude: frozenset[int] = frozenset()) -> Ticket:
        started = time.monotonic()
        ticket = self.try_acquire(cost, exclude)
        if ticket is not None:
            return ticket
        if len(self._queue) >= self.max_queue:
            message = f"token-guard's queue is full ({self.max_queue} requests waiting)."
            raise TooBusy(message, self.retry_after(cost))
        replica = await self._wait(_Waiter(cost, exclude))  # reserved by wake() when its turn came
        return Ticket(replica, cost, time.monotonic() - started)

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        ticket.released = True
        budget = self.budgets[ticket.replica]
        budget.tokens -= ticket.cost
        budget.requests -= 1
        now = time.monotonic()
        self._freed.append((now, ticket.cost))
        self._freed_tokens += ticket.cost
        self._forget(now)
        if self._queue:
            self.wake()

    def wake(self) -> None:
        """Admit waiters in order while the head of the queue fits somewhere (FIFO: no overtaking)."""
        while self._queue:
            head = self._queue[0]
            if head.future.done():
                self._queue.popleft()
                continue
            replica = self._pick(head.cost, head.exclude)
            if replica is None:
                return
            self._queue.popleft()
            self._reserve(replica, head.cost)
            head.future.set_result(replica)

    def _pick(self, cost: int, exclude: frozenset[int]) -> int | None:
        """The fitting replica with the fewest in-flight tokens (then requests); ties rotate, to spread idle load."""
        if len(self.budgets) == 1:  # one replica (the sidecar): no choice to make, on every request
            return 0 if 0 not in exclude and self.budgets[0].fits(cost) else None
        fitting = [i for i, b in enumerate(self.budgets) if i not in exclude and b.fits(cost)]
        count = len(self.budgets)
        chosen = min(
            fitting, key=lambda i: (self.budgets[i].tokens, self.budgets[i].requests, (i - self._turn) % count),
            default=None,
        )  # fmt: skip
        if chosen is not None:
            self._turn = (chosen + 1) % count
        return chosen

    def _reserve(self, replica: int, cost: int) -> None:
        self.budgets[replica].tokens += cost
        self.budgets[replica].requests += 1

    async def _wait(self, waiter: _Waiter) -> int:
        self._queue.append(waiter)
        return await wait_in_queue(
            waiter.future, self.queue_timeout_s, lambda: self._leave(waiter),
            lambda replica: self.release(Ticket(replica, waiter.cost, 0.0)), lambda: self.retry_after(waiter.cost),
        )  # fmt: skip

    def _leave(self, waiter: _Waiter) -> None:
        waiter.future.cancel()
        if waiter in self._queue:
            self._queue.remove(waiter)
        self.wake()  # a blocked head may have left: the next ones may fit

    def _forget(self, now: float) -> None:
        """Only the last minute says how fast budget frees up."""
        freed = self._freed
        while freed and now - freed[0][0] > RATE_WINDOW_S:
            self._freed_tokens -= freed.popleft()[1]

    def retry_after(self, cost: int) -> int:
        """Seconds until `cost` tokens are likely free, from the rate budget was released at over the last minute."""
        now = time.monotonic()
        self._forget(now)
        if not self._freed:
            return 1
        span = max(now - self._freed[0][0], 1.0)
        rate = self._freed_tokens / span
        waiting = sum(w.cost for w in self._queue) + cost
        return max(1, min(60, math.ceil(waiting / rate)))


CACHE_INFO = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)


async def wait_in_queue(
    admitted: asyncio.Future[T], timeout_s: float, leave: Callable[[], None], give_back: Callable[[T], None],
    retry_after: Callable[[], int],
) -> T:  # fmt: skip
    """A queued request's wait for `admitted`: 429 (TooBusy) at the deadline, after leaving the queue; when the
    client goes away meanwhile, it leaves the queue, or gives back what it was admitted with as it went."""
    try:
        return await asyncio.wait_for(asyncio.shield(admitted), timeout_s)
    except TimeoutError:
        if admitted.done():  # admitted right at the deadline
            return admitted.result()
        leave()
        message = f"token-guard's token budget is in use: the request waited {timeout_s:g} s in queue."
        raise TooBusy(message, retry_after()) from None
    except asyncio.CancelledError:  # the client went away while queued
        if admitted.done() and not admitted.cancelled():
            give_back(admitted.result())  # admitted as it was cancelled
        else:
            leave()
        raise


def kv_capacity(metrics_text: str) -> int | None:
    """Tokens of KV cache, from vLLM's `vllm:cache_config_info` metric (num_gpu_blocks * block_size)."""
    match = CACHE_INFO.search(metrics_text)
    if match is None:
        return None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group("labels")))
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None

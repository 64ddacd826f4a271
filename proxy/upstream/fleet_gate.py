"""The admission gate when guards share a Redis (redis.url). A request that fits in this process's credit
(blocks of the budget it holds in Redis, proxy/upstream/fleet_credit.py) is admitted at once, with no round trip.
Any other reserves from its replica's whole budget in Redis (proxy/fleet/budget.py) under a lease this process
renews while the request runs, and releases it at its end. Waiters queue here in FIFO order and are retried when
this process frees budget, and on a short poll for what other guards free.

Redis unreachable: with redis.failure "open" requests pass the local gate on this process's share of the
budget; with "closed" they are answered 503. The link's probe brings Redis back without a restart.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.errors import FleetStateUnavailable, TooBusy
from proxy.fleet.budget import FleetBudget
from proxy.fleet.link import RedisLink
from proxy.fleet.presence import Presence
from proxy.settings import AdmissionSettings, RedisSettings
from proxy.upstream.admission import Admission, Budget, Ticket, wait_in_queue
from proxy.upstream.fleet_credit import FleetCredit

log = logging.getLogger("token_guard.admission")

POLL_S = 0.02  # how soon a waiter sees budget that another guard freed
MAX_UNSENT = 10_000  # releases kept per replica while Redis is away (their leases would free them anyway)
CLOSED = "token-guard cannot reach the store its admission budget is shared through; try again shortly."


@dataclass(eq=False)
class _Waiter:
    cost: int
    exclude: frozenset[int]
    arrived: int  # arrival order: a waiter whose quick try failed takes its place by it, not behind later ones
    # a ticket, or None: Redis went away while it waited (admit it locally, or refuse it)
    future: asyncio.Future[Ticket | None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class FleetAdmission:
    def __init__(
        self, local: Admission, urls: Sequence[str], whole: Sequence[Budget], link: RedisLink,
        settings: AdmissionSettings, redis: RedisSettings,
    ) -> None:  # fmt: skip
        """`local`: this process's gate on its share (counts every ticket, admits when Redis is away); `whole`:
        each replica's whole budget, shared by every guard."""
        self.local, self.urls, self.whole, self.link = local, list(urls), list(whole), link
        self.budget = FleetBudget(link, redis.lease_s)
        self.presence = Presence(link, redis.lease_s)
        self.lease_s, self.closed = redis.lease_s, redis.failure == "closed"
        self.queue_timeout_s, self.max_queue = settings.queue_timeout_s, settings.max_queue
        self.fleet_tokens: dict[str, int] = {}  # each replica's tokens in flight across guards, as last seen
        self.credit = FleetCredit(self.budget, self.presence, local, urls, whole, redis.block_share,
                                   self.fleet_tokens)  # fmt: skip
        self.fallbacks = 0  # requests admitted on the local share while Redis was away
        self.refusals = 0  # requests answered 503 for it (redis.failure "closed")
        self._queue: collections.deque[_Waiter] = collections.deque()
        self._held: dict[str, int] = {}  # lease -> replica, of the reservations running here
        self._unsent: collections.defaultdict[int, list[str]] = collections.defaultdict(list)
        self._changed = asyncio.Event()
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self._trying: set[int] = set()  # arrivals whose quick try (a reservation with nobody queued) is in flight
        self._turn = 0

    @property
    def budgets(self) -> list[Budget]:
        return self.local.budgets

    @property
    def queued(self) -> int:
        return len(self._queue) + self.local.queued

    def try_acquire(self, cost: int, exclude: frozenset[int] = frozenset()) -> Ticket | None:
        """A ticket at once: on credit when nobody here waits before it, or while Redis is away on the local share
        ("open"). None: the round trip decides."""
        if self.link.healthy:
            return None if self._queue else self.credit.admit(cost, exclude)
        if self.closed:
            return None
        ticket = self.local.try_acquire(cost, exclude)
        self.fallbacks += ticket is not None
        return ticket

    async def acquire(self, cost: int, exclude: frozenset[int] = frozenset()) -> Ticket:
        if self.link.healthy and not self._queue and (ticket := self.credit.admit(cost, exclude)) is not None:
            return ticket
        started, arrived = time.monotonic(), next(self._arrivals)
        if not self._queue and not self._trying:  # nobody before it: one round trip, in this task
            self._trying.add(arrived)
            try:
                ticket = await self._reserve(cost, exclude)
            except FleetStateUnavailable:
                self.credit.forget()
                return await self._without_redis(cost, exclude)
            finally:
                self._trying.discard(arrived)
                self._changed.set()  # the waiters behind it may go now
            if ticket is not None:
                return ticket
        elif not self.link.healthy:
            return await self._without_redis(cost, exclude)
        if len(self._queue) >= self.max_queue:
            raise TooBusy(f"token-guard's queue is full ({self.max_queue} requests waiting).", self.retry_after(cost))
        ticket = await self._wait(_Waiter(cost, exclude, arrived))
        if ticket is None:
            return await self._without_redis(cost, exclude)
        ticket.waited_s = time.monotonic() - started
        return ticket

    def release(self, ticket: Ticket) -> None:
        if ticket.released:
            return
        self.local.release(ticket)
        if ticket.credit:
            self.credit.give(ticket)
        if ticket.lease is not None and self._held.pop(ticket.lease, None) is not None:
            self._unsent[ticket.replica].append(ticket.lease)
            self._changed.set()

    def wake(self) -> None:
        self.local.wake()
        self._changed.set()

    def retry_after(self, cost: int) -> int:
        return self.local.retry_after(cost + sum(w.cost for w in self._queue))

    async def run(self) -> None:
        """The background work: send releases, admit waiters, renew leases and this instance's heartbeat."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._pump())
            group.create_task(self._keep())
            group.create_task(self.credit.run())

    async def aclose(self) -> None:
        """Give back what this process holds in Redis: reservations released here but not yet there (a request that
        ended just before the stop; the pump that sends them is stopped), any still held, its blocks, its heartbeat."""
        for lease, replica in self._held.items():
            self._unsent[replica].append(lease)
        self._held.clear()
        await self._send_releases()
        try:
            await self.credit.aclose()
            await self.presence.leave()
        except FleetStateUnavailable:
            pass  # its heartbeat and its blocks' leases run out on their own

    async def _reserve(self, cost: int, exclude: frozenset[int]) -> Ticket | None:
        count = len(self.urls)
        order = [(self._turn + k) % count for k in range(count)]  # ties go round, to spread idle load
        candidates = [i for i in order if i not in exclude and self.local.budgets[i].available]
        lease = f"{self.presence.instance}:{next(self._ids)}"
        offered = [(self.urls[i], self.whole[i].max_tokens, self.whole[i].max_requests) for i in candidates]
        try:
            got = await self.budget.reserve(lease, cost, offered)
        except asyncio.CancelledError:  # the client left while Redis answered: give back what it may have got
            for replica in candidates:  # (releasing a reservation never made changes nothing)
                self._unsent[replica].append(lease)
            self._changed.set()
            raise
        return self._admitted(got, candidates, lease, cost)

    def _admitted(self, got: tuple[int, int] | None, candidates: list[int], lease: str, cost: int) -> Ticket | None:
        if got is None:
            return None
        replica = candidates[got[0]]
        self._turn = (replica + 1) % len(self.urls)
        self.fleet_tokens[self.urls[replica]] = got[1]
        self._held[lease] = replica
        return self.local.hold(replica, cost, lease)

    async def _without_redis(self, cost: int, exclude: frozenset[int]) -> Ticket:
        if self.closed:
            self.refusals += 1
            raise FleetStateUnavailable(CLOSED)
        self.fallbacks += 1
        return self.local.try_acquire(cost, exclude) or await self.local.acquire(cost, exclude)

    async def _wait(self, waiter: _Waiter) -> Ticket | None:
        place = len(self._queue)
        while place and self._queue[place - 1].arrived > waiter.arrived:
            place -= 1
        self._queue.insert(place, waiter)
        self._changed.set()

        def give_back(ticket: Ticket | None) -> None:
            if ticket is not None:
                self.release(ticket)
            else:  # told to go local as it left: nothing was reserved
                self._leave(waiter)

        return await wait_in_queue(waiter.future, self.queue_timeout_s, lambda: self._leave(waiter), give_back,
                                   lambda: self.retry_after(waiter.cost))  # fmt: skip

    def _leave(self, waiter: _Waiter) -> None:
        waiter.future.cancel()
        if waiter in self._queue:
            self._queue.remove(waiter)
        self._changed.set()

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._changed.clear()
            try:
                await self._send_releases()
                await self._admit_waiters()
            except Exception:  # a bug must not leave the waiters without their pump
                log.exception("fleet admission: unexpected error; the queue goes on")
            poll = loop.call_later(POLL_S, self._changed.set) if self._queue else None  # others' releases
            try:
                await self._changed.wait()
            finally:
                if poll is not None:
                    poll.cancel()

    async def _send_releases(self) -> None:
        for replica in list(self._unsent):
            leases, sent = self._unsent.pop(replica), False
            try:
                await self.budget.release(self.urls[replica], leases)
                sent = True
            except FleetStateUnavailable:
                pass
            finally:  # kept for when Redis answers again, or for aclose() when the stop cancelled the pump meanwhile
                if not sent:  # (a release Redis did see is harmless sent twice: it frees only what it still holds)
                    self._unsent[replica] = (leases + self._unsent[replica])[-MAX_UNSENT:]

    async def _admit_waiters(self) -> None:
        """The head of the queue first, then the next, while they get a reservation (FIFO: no overtaking here)."""
        while self._queue:
            head = self._queue[0]
            if head.future.done():
                self._queue.popleft()
                continue
            if self._trying and min(self._trying) < head.arrived:  # an earlier arrival's quick try is in flight
                return
            try:
                ticket = await self._reserve(head.cost, head.exclude)
            except FleetStateUnavailable:
                self._send_all_local()
                self.credit.forget()
                return
            if ticket is None:
                return
            if self._queue and self._queue[0] is head:
                self._queue.popleft()
            if head.future.done():  # it gave up while its reservation was being made
                self.release(ticket)
            else:
                head.future.set_result(ticket)

    def _send_all_local(self) -> None:
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)

    async def _keep(self) -> None:
        """Renew this process's leases and heartbeat, three times per lease (and read the totals, for the metrics)."""
        while True:
            try:
                await self.presence.beat()
                by_replica: collections.defaultdict[int, list[str]] = collections.defaultdict(list)
                for lease, replica in list(self._held.items()):
                    by_replica[replica].append(lease)
                for replica, leases in by_replica.items():
                    await self.budget.renew(self.urls[replica], leases)
                for url in self.urls:
                    self.fleet_tokens[url] = (await self.budget.in_flight(url))[0]
            except FleetStateUnavailable:
                pass  # the link logged it; leases not renewed in time free their budget for the others
            await asyncio.sleep(self.lease_s / 3)

"""The fleet admission gate against a real redis-server: two gates stand for two guards sharing one replica's
budget; reservations are atomic, leases renewed while held and freed when their guard stops renewing them, and a
Redis that goes away gives the configured behaviour (open: the local share; closed: 503) until it comes back."""

from __future__ import annotations

import asyncio
import signal
from contextlib import AsyncExitStack

import pytest

from proxy.errors import FleetStateUnavailable, TooBusy
from proxy.fleet.link import PROBE_INTERVAL_S
from tests.support.fleet_gate import URL, gate
from tests.support.polling import until
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401


def test_two_guards_share_one_budget(redis: RedisServer) -> None:
    async def run() -> None:
        async with AsyncExitStack() as stack:
            a = await stack.enter_async_context(gate(redis))
            b = await stack.enter_async_context(gate(redis))
            first = await a.acquire(60)
            assert a.try_acquire(10) is None  # a fleet reservation always takes a round trip
            waiting = asyncio.ensure_future(b.acquire(60))
            await asyncio.sleep(0.2)
            assert not waiting.done() and b.queued == 1  # 60 + 60 > 100, though b holds nothing itself
            small = await a.acquire(40)  # a's own queue is empty and 40 fits
            a.release(first)
            a.release(first)  # a second release frees nothing more
            second = await waiting  # b sees what a freed on its poll
            assert second.waited_s > 0 and (await b.budget.in_flight(URL)) == (100, 2)
            a.release(small)
            b.release(second)
            assert await until(lambda: a._unsent == {} and b._unsent == {})
            assert await until(lambda: a.fleet_tokens.get(URL) is not None)
            assert await b.budget.in_flight(URL) == (0, 0)

    asyncio.run(run())


@pytest.mark.parametrize("block_share", [0.0, 0.5])
def test_an_oversized_request_runs_alone_and_the_queue_is_fifo(redis: RedisServer, block_share: float) -> None:
    async def run() -> list[int]:
        async with gate(redis, block_share=block_share) as a:
            held = await a.acquire(100)
            order: list[int] = []

            async def want(cost: int) -> None:
                ticket = await a.acquire(cost)
                order.append(cost)
                a.release(ticket)

            tasks = [asyncio.ensure_future(want(c)) for c in (500, 5, 1)]
            await asyncio.sleep(0.1)
            assert a.queued == 3 and order == []  # the small ones do not overtake the big one
            a.release(held)
            await asyncio.wait_for(asyncio.gather(*tasks), 5)
            return order

    assert asyncio.run(run()) == [500, 5, 1]


def test_a_guard_that_stops_renewing_frees_its_budget_within_its_lease(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, running=False, lease_s=2.0) as dead, gate(redis, lease_s=1.0) as alive:
            await dead.acquire(100)  # never released, never renewed: as if its guard was killed
            waiting = asyncio.ensure_future(alive.acquire(100))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # the dead guard's lease still holds the budget
            ticket = await asyncio.wait_for(waiting, 10)  # then it runs out
            await asyncio.sleep(1.5)  # alive renews its own lease while it holds it: nobody else gets in
            async with gate(redis, queue_timeout_s=0.5) as other:
                with pytest.raises(TooBusy):
                    await other.acquire(100)
            alive.release(ticket)

    asyncio.run(run())


def test_redis_away_open_admits_on_the_local_share_and_recovers(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, tokens=100, share=50) as a:
            shared = await a.acquire(40)
            redis.stop(signal.SIGKILL)
            local = await a.acquire(10)  # Redis away: the local share, which counts what runs here (40 + 10)
            assert local.lease is None and a.fallbacks == 1 and not a.link.healthy
            assert a.try_acquire(10) is None  # 60 > 50: over the share
            a.release(shared)
            a.release(local)
            assert a.try_acquire(50) is not None
            redis.start()
            assert await until(lambda: a.link.healthy)  # the probe brought it back
            again = await a.acquire(100)
            assert again.lease is not None

    asyncio.run(run())


def test_redis_away_closed_refuses_and_recovers(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, failure="closed") as a:
            held = await a.acquire(100)
            waiting = asyncio.ensure_future(a.acquire(10))
            await asyncio.sleep(0.1)
            redis.stop(signal.SIGKILL)
            with pytest.raises(FleetStateUnavailable):  # the waiter learns at the pump's next try
                await asyncio.wait_for(waiting, 5)
            assert a.try_acquire(10) is None
            with pytest.raises(FleetStateUnavailable):
                await a.acquire(10)
            assert a.refusals == 2
            a.release(held)
            redis.start()  # empty: the reservation held before is gone with it
            await asyncio.sleep(PROBE_INTERVAL_S)
            assert (await a.acquire(100)).lease is not None

    asyncio.run(run())


def test_a_waiter_that_leaves_takes_nothing(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis) as a:
            held = await a.acquire(100)
            waiting = asyncio.ensure_future(a.acquire(50))
            await asyncio.sleep(0.1)
            waiting.cancel()
            await asyncio.sleep(0.1)
            assert a.queued == 0
            a.release(held)
            assert await until(lambda: a._unsent == {})
            assert await a.budget.in_flight(URL) == (0, 0)

    asyncio.run(run())


def test_clients_that_leave_while_redis_answers_leave_nothing_reserved(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, tokens=10**6) as a:
            for step in range(40):  # cancelled at every point of the round trip, before it and after it
                task = asyncio.ensure_future(a.acquire(10))
                await asyncio.sleep(step * 0.00005)
                task.cancel()
                try:
                    a.release(await task)  # it had its ticket before the cancel landed
                except asyncio.CancelledError:
                    pass
            assert await until(lambda: not a._unsent)
            assert await a.budget.in_flight(URL) == (0, 0) and a.local.budgets[0].tokens == 0

    asyncio.run(run())

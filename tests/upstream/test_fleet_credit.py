"""Credit in blocks against a real redis-server: a request admitted on credit sends Redis nothing; guards contending
for a small budget both make progress and never hold more than it together; credit goes back when idle, when
another guard's request fits nowhere (an oversized one then runs alone), and with its lease when its guard dies;
and Redis going away takes the credit with it (redis.failure decides, as without credit)."""

from __future__ import annotations

import asyncio
import random
import signal
import socket
from contextlib import AsyncExitStack

import pytest

from proxy.errors import FleetStateUnavailable
from proxy.upstream.fleet_gate import FleetAdmission
from tests.support.fleet_gate import URL, gate
from tests.support.polling import until
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401

SHARE = 0.5  # redis.block_share: half the budget, over the guards sharing it


def commands(redis: RedisServer) -> int:
    """Commands Redis has run since it started (its own count: INFO commandstats), INFO itself excluded."""
    with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as sock:
        sock.sendall(b"INFO commandstats\r\n")
        data = sock.recv(65536)
        header, _, body = data.partition(b"\r\n")  # a bulk string: $<length>, then the text
        while len(body) < int(header[1:]):
            body += sock.recv(65536)
    lines = body.decode().splitlines()
    calls = [int(line.split("calls=")[1].split(",")[0]) for line in lines if line.startswith("cmdstat_")]
    info = [int(line.split("calls=")[1].split(",")[0]) for line in lines if line.startswith("cmdstat_info:")]
    return sum(calls) - sum(info)


async def with_block(a: FleetAdmission) -> None:
    """A request by the round trip asks for a block; one tending takes it (the gate's background is not running)."""
    a.release(await a.acquire(10))
    await a._send_releases()
    await a.credit.tend()
    assert a.credit.blocks[0].held


def test_a_request_admitted_on_credit_sends_redis_nothing(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, tokens=1000, running=False, block_share=SHARE) as a:
            await with_block(a)
            assert await a.budget.in_flight(URL) == (500, 1)  # the block: half the budget, this guard alone
            sent, ran = a.link.calls, commands(redis)
            tickets = [await a.acquire(100) for _ in range(5)]
            assert all(t.credit for t in tickets) and a.try_acquire(100) is None  # 500 of 500 in use
            for ticket in tickets:
                a.release(ticket)
            assert a.link.calls == sent and commands(redis) == ran  # not one command
            assert a.local.budgets[0].tokens == 0 and a.credit.blocks[0].used_tokens == 0

    asyncio.run(run())


def test_two_guards_contending_for_a_small_budget_both_progress_within_it(redis: RedisServer) -> None:
    budget, per_guard = 100, 60
    running, peak, on_credit = 0, 0, 0
    done = {"a": 0, "b": 0}

    async def client(name: str, g: FleetAdmission, rng: random.Random) -> None:
        nonlocal running, peak, on_credit
        cost = 10  # the first fits in either block
        while done[name] < per_guard:
            ticket = g.try_acquire(cost) or await g.acquire(cost)
            running += cost
            peak = max(peak, running)
            on_credit += ticket.credit
            await asyncio.sleep(rng.random() * 0.004)
            running -= cost
            g.release(ticket)
            done[name] += 1
            cost = rng.choice([10, 20, 30])

    async def run() -> None:
        async with AsyncExitStack() as stack:
            guards = [gate(redis, tokens=budget, queue_timeout_s=30.0, block_share=SHARE) for _ in range(2)]
            a, b = [await stack.enter_async_context(g) for g in guards]
            for g in a, b:  # each holds a block as the contention starts
                g.release(await g.acquire(10))
                assert await until(lambda g=g: g.credit.blocks[0].held)  # type: ignore[misc]
            rng = random.Random(15)
            clients = [client(name, g, random.Random(rng.random())) for name, g in [("a", a), ("b", b)] * 4]
            await asyncio.wait_for(asyncio.gather(*clients), 60)  # both got through: neither starved
            assert await until(lambda: a._unsent == {} and b._unsent == {})

    asyncio.run(run())
    assert peak <= budget  # never more at once than the whole budget, blocks included
    assert on_credit > 0  # and some went without a round trip


def test_credit_goes_back_when_idle(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, tokens=1000, block_share=SHARE) as a:
            for _ in range(3):
                ticket = a.try_acquire(50) or await a.acquire(50)
                a.release(ticket)
                await until(lambda: a.credit.blocks[0].held)
            assert (await a.budget.in_flight(URL))[0] >= 250  # a block is held once the requests ended
            assert await until(lambda: not a.credit.blocks[0].held, timeout_s=10)  # then idle: it goes back
            assert await a.budget.in_flight(URL) == (0, 0)

    asyncio.run(run())


def test_credit_forgotten_after_a_failed_call_is_still_given_back(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, tokens=1000, running=False, block_share=SHARE) as a:
            await with_block(a)
            a.credit.forget()  # as after a call that ran out of time: Redis may hold the block still
            assert a.credit.admit(10, frozenset()) is None  # nothing is admitted on it meanwhile
            a.credit.blocks[0].drawn_at = float("-inf")  # and long idle since
            assert await a.budget.in_flight(URL) == (500, 1)
            await a.credit.tend()  # not held here, not wished for, but Redis is told so
            assert await a.budget.in_flight(URL) == (0, 0)

    asyncio.run(run())


def test_an_oversized_request_elsewhere_gets_the_credit_back_and_runs_alone(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, tokens=100, block_share=SHARE) as holder, gate(redis, tokens=100) as other:
            holder.release(await holder.acquire(10))
            assert await until(lambda: holder.credit.blocks[0].held)
            big = await asyncio.wait_for(other.acquire(500), 10)  # it waits for the holder's block, not its idling
            assert big.lease is not None and await other.budget.in_flight(URL) == (500, 1)
            assert not holder.credit.blocks[0].held
            assert holder.try_acquire(10) is None  # while it runs, nobody else does
            other.release(big)

    asyncio.run(run())


def test_a_dead_guards_credit_is_freed_within_its_lease(redis: RedisServer) -> None:
    async def run() -> None:
        async with gate(redis, running=False, lease_s=1.0, block_share=SHARE) as dead:
            await with_block(dead)  # held, never renewed nor given back: as if its guard was killed
            async with gate(redis, lease_s=1.0) as alive:
                ticket = await asyncio.wait_for(alive.acquire(100), 10)  # the whole budget, once the lease ran out
                assert await alive.budget.in_flight(URL) == (100, 1)
                alive.release(ticket)

    asyncio.run(run())


@pytest.mark.parametrize("failure", ["open", "closed"])
def test_redis_away_takes_the_credit_with_it(redis: RedisServer, failure: str) -> None:
    async def run() -> None:
        async with gate(redis, tokens=1000, share=500, failure=failure, block_share=SHARE) as a:
            a.release(await a.acquire(10))
            assert await until(lambda: a.credit.blocks[0].held)
            redis.stop(signal.SIGKILL)
            assert await until(lambda: not a.link.healthy)  # whichever call finds it gone first
            assert a.credit.admit(10, frozenset()) is None and not a.credit.blocks[0].held  # credit with it
            if failure == "closed":
                assert a.try_acquire(10) is None
                with pytest.raises(FleetStateUnavailable):
                    await a.acquire(10)
            else:
                ticket = a.try_acquire(10)
                assert ticket is not None and not ticket.credit and a.fallbacks == 1
                a.release(ticket)

    asyncio.run(run())

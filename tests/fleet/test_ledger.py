"""The ledger of stored responses in a real Redis: what one guard writes another finds, within the time to live and
the bound (oldest evicted first), and a Redis that does not answer finds nothing rather than failing the request."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from proxy.fleet.ledger import INDEX, TOTAL, RedisLedger
from proxy.fleet.link import RedisLink
from proxy.policy.ledger import Stored
from tests.support.polling import eventually
from tests.support.redis import RedisServer, redis_server


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def entry(rid: str, words: int = 1) -> Stored:
    return Stored(rid, "owner", "http://replica", "tiny", [{"role": "user", "content": "w " * words}])


def run(redis: RedisServer, steps: object) -> object:
    async def main() -> object:
        link = RedisLink(redis.url, 1000)
        try:
            return await steps(link)  # type: ignore[operator]
        finally:
            await link.aclose()

    return asyncio.run(main())


def test_what_one_guard_writes_another_finds_and_drops(redis: RedisServer) -> None:
    async def steps(link: RedisLink) -> object:
        one, other = RedisLedger(link, 60, 10_000), RedisLedger(link, 60, 10_000)
        await one.put(entry("resp_shared"))
        found = await other.find("resp_shared")
        await other.drop("resp_shared")
        return found, await one.find("resp_shared"), await link.call(lambda c: c.zscore(INDEX, "resp_shared"))

    assert run(redis, steps) == (entry("resp_shared"), None, None)


def test_the_bound_evicts_the_oldest_entries(redis: RedisServer) -> None:
    size = len(entry("resp_a", 100).encode())

    async def steps(link: RedisLink) -> object:
        await link.call(lambda c: c.flushdb())
        ledger = RedisLedger(link, 60, 2 * size)
        for rid in ("resp_a", "resp_b", "resp_c"):
            await ledger.put(entry(rid, 100))
        found = [await ledger.find(rid) is not None for rid in ("resp_a", "resp_b", "resp_c")]
        total = await link.call(lambda c: c.get(TOTAL))
        return found, int(total) if total is not None else None

    assert run(redis, steps) == ([False, True, True], 2 * size)


def test_an_entry_expires_after_its_time_to_live(redis: RedisServer) -> None:
    async def steps(link: RedisLink) -> object:
        await RedisLedger(link, 0.2, 10_000).put(entry("resp_short"))
        return await link.call(lambda c: c.pttl("token-guard:response:resp_short"))

    assert 0 < int(run(redis, steps)) <= 200  # type: ignore[call-overload]

    async def gone(link: RedisLink) -> object:
        return await RedisLedger(link, 0.2, 10_000).find("resp_short")

    assert eventually(lambda: run(redis, gone) is None, timeout_s=5)


def test_a_redis_that_does_not_answer_finds_nothing_and_writes_nothing() -> None:
    server = RedisServer()

    async def steps(link: RedisLink) -> object:
        ledger = RedisLedger(link, 60, 10_000)
        await ledger.put(entry("resp_x"))
        await ledger.drop("resp_x")
        return await ledger.find("resp_x")

    assert run(server, steps) is None  # never started: nothing listens on its port

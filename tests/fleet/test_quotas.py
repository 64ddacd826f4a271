"""Per-key quotas in a real redis-server: one bucket for every guard that shares it, checked and charged at once,
given back, expired once full again; and when Redis goes away, the configured behaviour (this process's buckets,
or 503) until it is back."""

from __future__ import annotations

import asyncio
import signal

import pytest

from proxy.errors import FleetStateUnavailable
from proxy.exchange.quotas import Quotas
from proxy.fleet.link import RedisLink
from proxy.fleet.quotas import QUOTAS, RedisQuotas
from proxy.policy.quota import CHECK, TAKE, Window
from proxy.settings import load_settings
from proxy.settings.sections import KeySettings
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401

LIMITS = (1000, 10)


def test_two_guards_spend_one_bucket(redis: RedisServer) -> None:
    async def run() -> None:
        one, two = RedisLink(redis.url, 250), RedisLink(redis.url, 250)
        first, second = RedisQuotas(one), RedisQuotas(two)
        taken = await first.charge("team", LIMITS, 600)
        assert taken.allowed and taken.tokens is not None and taken.tokens.remaining == 400
        refused = await second.charge("team", LIMITS, 600)  # the other guard sees what the first spent
        assert not refused.allowed and refused.retry_after_ms > 10_000
        assert refused.requests is not None and refused.requests.remaining == 9  # neither bucket was charged
        await second.give_back("team", LIMITS, 500)
        assert (await first.charge("team", LIMITS, 600)).allowed
        look = await first.peek("team", LIMITS)
        assert look.tokens is not None and look.tokens.remaining < 400 and look.requests is not None
        assert look.requests.remaining == 8
        ttl = await one.call(lambda client: client.pttl(QUOTAS + "team"))
        assert 1000 < ttl <= 61_000  # gone once it would be full again
        await one.aclose()
        await two.aclose()

    asyncio.run(run())


def test_a_reservation_above_the_limit_is_refused_and_work_done_is_taken_into_debt(redis: RedisServer) -> None:
    async def run() -> None:
        link = RedisLink(redis.url, 250)
        quotas = RedisQuotas(link)
        too_large = await quotas.charge("big", (1000, 10), 2500)
        assert not too_large.allowed and too_large.too_large
        assert too_large.tokens == Window(1000, 1000, 0) and too_large.requests == Window(10, 10, 0)  # nothing taken
        assert (await quotas.charge("big", (1000, 10), 2500, TAKE)).allowed  # a count already made: into debt
        after = await quotas.charge("big", (1000, 10), 1)
        assert not after.allowed and after.retry_after_ms > 60_000 and not after.too_large
        assert not (await quotas.charge("big", (1000, 10), 0, CHECK)).allowed
        assert await link.call(lambda client: client.pttl(QUOTAS + "big")) > 120_000
        await link.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("failure", ["open", "closed"])
def test_redis_gone_then_back(redis: RedisServer, failure: str) -> None:
    key = KeySettings("team", "0" * 64, tokens_per_minute=1000)
    settings = load_settings({"redis.url": redis.url, "redis.failure": failure}, environ={})

    async def run() -> None:
        link = RedisLink(redis.url, 250)
        quotas = Quotas(settings, link)
        charged = await quotas.charge(key, 900)
        assert charged.allowed and charged.fleet
        redis.stop(signal.SIGKILL)
        await quotas.give_back(key, 100, charged.fleet)  # lost while Redis is away: the safe side
        if failure == "closed":
            with pytest.raises(FleetStateUnavailable):
                await quotas.charge(key, 10)
        else:  # this process's own bucket, from what Redis last said was left: 100 (and what refilled since)
            refused = await quotas.charge(key, 900)
            assert not refused.allowed and not refused.fleet and refused.tokens is not None
            assert 100 <= refused.tokens.remaining < 150
            verdict = await quotas.charge(key, 100)
            assert verdict.allowed and not verdict.fleet
            await quotas.give_back(key, 80, verdict.fleet)  # back where it was charged: this process's bucket
            assert (await quotas.charge(key, 80)).allowed
        redis.start()
        assert await _back(quotas, key, link)
        assert await link.call(lambda client: client.exists(QUOTAS + "team")) == 1  # charged in Redis again
        await link.aclose()

    asyncio.run(run())


async def _back(quotas: Quotas, key: KeySettings, link: RedisLink) -> bool:
    """Bounded tries until a charge goes through Redis again (the link tries every PROBE_INTERVAL_S)."""
    for _ in range(100):
        try:
            await quotas.charge(key, 1)
        except FleetStateUnavailable:
            pass
        if link.healthy:
            return True
        await asyncio.sleep(0.05)
    return False

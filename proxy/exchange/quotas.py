"""Per-key quotas on the request path: charge a keyed request before it is forwarded (429 with Retry-After when its
key is over), settle the charge against what the answer says it used, and the x-ratelimit-* headers of every answer.

On Redis (redis.url) when configured, so that a key's quota holds across guards and workers; per process
otherwise (each of `server.workers` with its share). When Redis does not answer: redis.failure "open" uses this
process's buckets, each limit divided by the guard processes last seen alive in Redis (their heartbeats,
fleet/presence.py) and each key's buckets starting from what Redis last said it had left, divided the same way, so
that the processes together keep to the key's limits; "closed" answers 503."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from proxy.errors import FleetStateUnavailable, TooBusy
from proxy.policy.quota import CHARGE, Limits, LocalQuotas, Verdict, Window, duration
from proxy.settings import Settings
from proxy.settings.sections import KeySettings

if TYPE_CHECKING:
    from proxy.fleet.link import RedisLink
    from proxy.fleet.quotas import RedisQuotas

log = logging.getLogger("token_guard.quotas")


class Quotas:
    def __init__(
        self, settings: Settings, link: RedisLink | None = None, alive: Callable[[], int] | None = None
    ) -> None:
        """`alive`: the guard processes last seen sharing the Redis, this one included (0 before any was seen)."""
        self.workers = settings.server.workers
        self.local = LocalQuotas(self.workers)
        self.fleet: RedisQuotas | None = None
        if link is not None:  # imported only here: without a Redis, redis is never imported
            from proxy.fleet.quotas import RedisQuotas

            self.fleet = RedisQuotas(link)
        self.alive = alive
        self.closed = settings.redis.failure == "closed"

    async def charge(self, key: KeySettings, tokens: int, mode: int = CHARGE) -> Verdict:
        """Take `tokens` and one request from `key`'s quotas as `mode` says (policy/quota.py: a reservation, work
        already done, or a check that takes nothing), or nothing when refused (`allowed` false)."""
        limits = _limits(key)
        return await self._fleet_or_local(
            key,
            lambda fleet: fleet.charge(key.name, limits, tokens, mode),
            lambda now: self.local.charge(key.name, limits, tokens, now, mode),
        )

    async def peek(self, key: KeySettings) -> Verdict:
        limits = _limits(key)
        return await self._fleet_or_local(
            key, lambda fleet: fleet.peek(key.name, limits), lambda now: self.local.peek(key.name, limits, now)
        )

    async def told(self, key: KeySettings) -> dict[str, str]:
        """The x-ratelimit-* headers of a look at `key`'s buckets, which charges nothing; none when Redis does not
        answer and redis.failure is "closed" (the answer goes out without them)."""
        try:
            return (await self.peek(key)).headers()
        except FleetStateUnavailable:
            return {}

    async def give_back(self, key: KeySettings, amount: int, fleet: bool) -> None:
        """Return what a request did not use to the buckets that charged it (`fleet`: Redis); lost when Redis does
        not answer (the key stays charged: the safe side)."""
        limits = _limits(key)
        if self.fleet is None or not fleet:
            self.local.give_back(key.name, limits, amount, _now_ms())
            return
        try:
            verdict = await self.fleet.give_back(key.name, limits, amount)
        except FleetStateUnavailable:
            log.debug("%d tokens not given back to key %s: Redis does not answer", amount, key.name)
            return
        if verdict is not None:
            self.local.mirror(key.name, limits, verdict, _now_ms())

    async def _fleet_or_local(
        self, key: KeySettings, fleet: Callable[[RedisQuotas], Awaitable[Verdict]], local: Callable[[float], Verdict]
    ) -> Verdict:
        if self.fleet is not None:
            self.local.share = self._share()
            try:
                verdict = await fleet(self.fleet)
            except FleetStateUnavailable:
                if self.closed:
                    raise
            else:
                self.local.mirror(key.name, _limits(key), verdict, _now_ms())
                return verdict
        return local(_now_ms())

    def _share(self) -> int:
        """How many processes keep to a key's limits together while Redis does not answer: those last seen alive in
        it, or this guard's workers when none was seen yet."""
        seen = self.alive() if self.alive is not None else 0
        return seen if seen > 0 else self.workers


def over_quota(key: KeySettings, verdict: Verdict, tokens: int) -> TooBusy:
    """OpenAI's message: which limit, the limit, what is left, what was asked, when to try again; or, for a request
    alone over the limit, OpenAI's "Request too large" (trying again cannot help: it must ask for less)."""
    if verdict.too_large:
        message = (
            f"Request too large for API key `{key.name}` on tokens per min (TPM): Limit "
            f"{verdict.tokens.limit if verdict.tokens else key.tokens_per_minute}, "
            f"Requested {tokens}. The input or output tokens must be reduced in order to run successfully "
            "(max_tokens, or n)."
        )
        return TooBusy(message, 60)
    wait = duration(verdict.retry_after_ms)
    requests = verdict.requests
    if requests is not None and requests.remaining < 1:
        which, window, asked = "requests per min (RPM)", requests, 1
    else:
        which, window, asked = "tokens per min (TPM)", verdict.tokens or Window(0, 0, 0), tokens
    message = (
        f"Rate limit reached for API key `{key.name}` on {which}: Limit {window.limit}, Remaining {window.remaining}, "
        f"Requested {asked}. Please try again in {wait}."
    )
    return TooBusy(message, verdict.retry_after_s)


def _limits(key: KeySettings) -> Limits:
    return key.tokens_per_minute, key.requests_per_minute


def _now_ms() -> float:
    return time.monotonic() * 1000

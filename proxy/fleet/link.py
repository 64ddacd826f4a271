"""The link to Redis, where guards share state: one asyncio client, every call bounded by a timeout, and whether
Redis answers, flipped with one log line each way. The one module that imports redis: its errors become
`FleetStateUnavailable` here.

Redis is down once a connection fails, or after `SLOW_LIMIT` calls in a row ran out of time (one late answer is more
often this process's own event loop lagging than Redis gone). While it is down, calls fail at once, except one trial
every `PROBE_INTERVAL_S`: the first that succeeds brings the link back, without a restart and without a burst of slow
calls against a Redis that does not answer.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.errors import FleetStateUnavailable

log = logging.getLogger("token_guard.redis")

T = TypeVar("T")
PREFIX = "token-guard:"  # every key the guards write starts with it
PROBE_INTERVAL_S = 0.25
SLOW_LIMIT = 2
MAX_CONNECTIONS = 64


class RedisLink:
    def __init__(self, url: str, timeout_ms: int) -> None:
        self.url = url
        self.where = _without_password(url)
        self.timeout_s = timeout_ms / 1000
        self.client: redis.Redis = redis.Redis.from_url(
            url,
            # No socket_timeout: with one, redis-py sends through asyncio.wait_for, which on Python 3.11 can swallow
            # a cancellation (the client's task goes on as if never cancelled). call() bounds every call instead.
            socket_timeout=None,
            socket_connect_timeout=self.timeout_s,
            # one retry on a fresh connection (a pooled one Redis closed), within the same bound
            retry=Retry(NoBackoff(), 1),
            max_connections=MAX_CONNECTIONS,
        )
        self.healthy = True
        self.errors = 0  # failed calls since start (token_guard_redis_errors_total)
        self.calls = 0  # calls sent since start, answered or not
        self.outages = 0  # times it went down since start
        self._in_a_row = 0  # failed calls since the last that succeeded
        self._next_trial = 0.0
        self._trying = False

    async def call(self, factory: Callable[[redis.Redis], Awaitable[T]]) -> T:
        """`factory(client)`'s result within the timeout, or `FleetStateUnavailable`."""
        trial = not self.healthy
        if trial:
            if self._trying or time.monotonic() < self._next_trial:
                raise FleetStateUnavailable(f"Redis at {self.where} is unreachable.")
            self._trying = True
        self.calls += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await factory(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            if self._failed(exc):
                await self._forget_connections()
            raise FleetStateUnavailable(f"Redis at {self.where} is unreachable.") from None
        finally:
            if trial:
                self._trying = False
        self._in_a_row = 0
        if trial:
            self._recovered()
        return result

    def script(self, source: str) -> Script:
        return Script(self, source)

    async def ping(self) -> bool:
        try:
            await self.call(lambda client: client.ping())
        except FleetStateUnavailable:
            return False
        return True

    async def watch(self, interval_s: float = 1.0) -> None:
        """Ping on a timer, so that the link's state (and its metric) follows Redis even when no request calls."""
        while True:
            await asyncio.sleep(interval_s if self.healthy else PROBE_INTERVAL_S)
            await self.ping()

    def _failed(self, exc: BaseException) -> bool:
        """Count the failure; True when it is the one that flips the link down."""
        self.errors += 1
        self._in_a_row += 1
        self._next_trial = time.monotonic() + PROBE_INTERVAL_S
        late = isinstance(exc, TimeoutError | RedisTimeoutError)  # (the built-in TimeoutError is an OSError)
        gone = (not late and isinstance(exc, RedisConnectionError | OSError)) or self._in_a_row >= SLOW_LIMIT
        if not self.healthy or not gone:
            return False
        self.healthy = False
        self.outages += 1
        reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
        log.warning("Redis at %s is unreachable (%s): fleet state is off until it answers again", self.where,
                    reason)  # fmt: skip
        return True

    async def _forget_connections(self) -> None:
        """Drop every pooled connection, so that none of those to the Redis that went away fails a call after it
        is back."""
        try:
            await self.client.connection_pool.disconnect(inuse_connections=True)
        except (RedisError, OSError):
            pass

    def _recovered(self) -> None:
        if not self.healthy:
            self.healthy = True
            log.warning("Redis at %s answers again: fleet state is back", self.where)

    async def aclose(self) -> None:
        await self.client.aclose()


class Script:
    """A Lua script run by its SHA (loaded again by the client when Redis has forgotten it, e.g. after a restart)."""

    def __init__(self, link: RedisLink, source: str) -> None:
        self.link = link
        self._script = link.client.register_script(source)

    async def __call__(self, keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
        return await self.link.call(lambda client: self._script(keys=list(keys), args=list(args), client=client))


def _without_password(url: str) -> str:
    return re.sub(r"//[^@/]*@", "//***@", url)

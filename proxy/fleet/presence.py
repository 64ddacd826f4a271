"""Which guards share a Redis: each guard process keeps an entry that expires unless its heartbeat renews it, and
`token-guard doctor` counts the entries alive. Expiry is judged by Redis's clock, so guards' clocks may differ."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket

from proxy.errors import FleetStateUnavailable
from proxy.fleet.link import PREFIX, RedisLink

INSTANCES = PREFIX + "instances"  # a sorted set: instance id -> when its entry expires (Redis ms)

# ARGV: the instance id ('' only counts), its time to live in ms. Returns how many instances are alive.
BEAT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ARGV[1] ~= '' then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2])) end
end
return redis.call('ZCARD', KEYS[1])
"""


def instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Presence:
    def __init__(self, link: RedisLink, ttl_s: float, instance: str | None = None) -> None:
        self.link, self.ttl_ms = link, max(1, round(ttl_s * 1000))
        self.instance = instance or instance_id()
        self.alive = 0  # instances seen at the last heartbeat, this one included
        self._beat = link.script(BEAT)

    async def beat(self) -> int:
        """Renew this instance's entry; how many instances are alive. Raises FleetStateUnavailable."""
        self.alive = int(await self._beat([INSTANCES], [self.instance, self.ttl_ms]))
        return self.alive

    async def run(self) -> None:
        """Beat three times per time to live, for as long as the instance runs (through Redis going and coming)."""
        while True:
            try:
                await self.beat()
            except FleetStateUnavailable:
                pass  # the link logged it; the entry comes back with Redis
            await asyncio.sleep(self.ttl_ms / 3000)

    async def leave(self) -> None:
        await self.link.call(lambda client: client.zrem(INSTANCES, self.instance))


async def count_instances(link: RedisLink) -> int:
    """Guard processes with a live heartbeat. Raises FleetStateUnavailable."""
    return int(await link.script(BEAT)([INSTANCES], ["", 0]))

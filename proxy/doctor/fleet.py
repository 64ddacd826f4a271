"""The check's look at the Redis that guards share budgets through (redis.url): whether it answers, and
how many guard processes keep a live heartbeat in it."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.errors import FleetStateUnavailable
from proxy.settings import RedisSettings


@dataclass(frozen=True)
class FleetInfo:
    where: str  # the URL, without its password
    reachable: bool
    instances: int | None  # guard processes (each worker counts) with a live heartbeat

    def line(self) -> str:
        if not self.reachable:
            return f"Redis {self.where}: UNREACHABLE: each guard admits on its own share, or refuses (redis.failure)"
        return f"Redis {self.where}: reachable, shared by {self.instances} guard process(es) with a live heartbeat"


async def fleet_info(redis: RedisSettings) -> FleetInfo | None:
    if redis.url is None:
        return None
    from proxy.fleet.link import RedisLink  # only with a Redis configured
    from proxy.fleet.presence import count_instances

    link = RedisLink(redis.url, redis.timeout_ms)
    try:
        return FleetInfo(link.where, True, await count_instances(link))
    except FleetStateUnavailable:
        return FleetInfo(link.where, False, None)
    finally:
        await link.aclose()

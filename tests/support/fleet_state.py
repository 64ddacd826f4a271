"""What a fleet of guards left in a real Redis, read as a test checks it after a guard stopped: a replica's reserved
(tokens, requests), the guards' heartbeats and a key's token bucket."""

from __future__ import annotations

import asyncio

from proxy.fleet.budget import FleetBudget
from proxy.fleet.link import PREFIX, RedisLink
from proxy.fleet.presence import count_instances

State = tuple[tuple[int, int], int, dict[str, str]]


def fleet_state(redis_url: str, key: str, replica: str = "") -> State:
    """(`replica`'s reserved tokens and requests, or (0, 0) without one; heartbeats alive; key `key`'s bucket)."""

    async def read() -> State:
        link = RedisLink(redis_url, 1000)
        try:
            reserved = await FleetBudget(link, 120).in_flight(replica) if replica else (0, 0)
            bucket = await link.call(lambda client: client.hgetall(PREFIX + f"quota:{key}"))
            return reserved, await count_instances(link), {_text(k): _text(v) for k, v in bucket.items()}
        finally:
            await link.aclose()

    return asyncio.run(read())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

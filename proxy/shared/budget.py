"""Each upstream replica's in-flight budget, shared in Redis by every guard and worker: reservations made and
released atomically by Lua scripts, each with a lease that its guard renews while the request runs.

Per replica (keyed by its URL), a sorted set of reservation id -> lease expiry, a hash of reservation id -> cost,
and a hash of the running totals. Every reservation first drops the expired leases (a guard that died), by Redis's
own clock, so guards' clocks never matter. The same rules as the local gate: a request fits when the replica's
request and token budgets both hold it, or when the replica is idle (an oversized request runs alone); among the
replicas it fits, it takes the one with the fewest tokens in flight.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.shared.link import PREFIX, RedisLink

Candidate = tuple[str, int, int]  # a replica's URL, its whole token and request budgets (0: none)

NOW = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
"""

# KEYS: (leases, costs, totals) per candidate replica. ARGV: id, cost, lease ms, then (max tokens, max requests) per
# candidate (0: no such budget). Returns {chosen candidate (1-based, 0: none fits), its tokens in flight after}.
RESERVE = (
    NOW
    + """
local id, cost, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local best, best_tokens, best_requests = 0, 0, 0
for i = 1, #KEYS / 3 do
  local leases, costs, totals = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now)
  if #expired > 0 then
    local freed = 0
    for _, e in ipairs(expired) do
      freed = freed + tonumber(redis.call('HGET', costs, e) or '0')
      redis.call('HDEL', costs, e)
      redis.call('ZREM', leases, e)
    end
    redis.call('HINCRBY', totals, 'tokens', -freed)
    redis.call('HINCRBY', totals, 'requests', -#expired)
  end
  local tokens = tonumber(redis.call('HGET', totals, 'tokens') or '0')
  local requests = tonumber(redis.call('HGET', totals, 'requests') or '0')
  local max_tokens, max_requests = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local fits = (max_requests == 0 or requests < max_requests)
    and (max_tokens == 0 or tokens + cost <= max_tokens or requests == 0)
  if fits and (best == 0 or tokens < best_tokens or (tokens == best_tokens and requests < best_requests)) then
    best, best_tokens, best_requests = i, tokens, requests
  end
end
if best == 0 then return {0, 0} end
redis.call('ZADD', KEYS[3 * best - 2], now + lease, id)
redis.call('HSET', KEYS[3 * best - 1], id, cost)
redis.call('HINCRBY', KEYS[3 * best], 'tokens', cost)
redis.call('HINCRBY', KEYS[3 * best], 'requests', 1)
return {best, best_tokens + cost}
"""
)

# KEYS: leases, costs, totals of one replica. ARGV: reservation ids. Returns how many were still held.
RELEASE = """
local freed, n = 0, 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    freed = freed + tonumber(redis.call('HGET', KEYS[2], id) or '0')
    redis.call('HDEL', KEYS[2], id)
    n = n + 1
  end
end
if n > 0 then
  redis.call('HINCRBY', KEYS[3], 'tokens', -freed)
  redis.call('HINCRBY', KEYS[3], 'requests', -n)
end
return n
"""

# KEYS: leases of one replica. ARGV: lease ms, then reservation ids. Only leases still held are renewed (XX).
RENEW = (
    NOW
    + """
local expiry = now + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i]) end
return n
"""
)


def keys(replica: str) -> list[str]:
    base = f"{PREFIX}admission:{replica}:"
    return [base + "leases", base + "costs", base + "totals"]


class SharedBudget:
    def __init__(self, link: RedisLink, lease_s: float) -> None:
        self.link, self.lease_ms = link, max(1, round(lease_s * 1000))
        self._reserve, self._release, self._renew = link.script(RESERVE), link.script(RELEASE), link.script(RENEW)

    async def reserve(self, lease: str, cost: int, candidates: Sequence[Candidate]) -> tuple[int, int] | None:
        """(index into `candidates`, that replica's tokens in flight with this one), or None when none has room.
        Raises SharedStateUnavailable."""
        if not candidates:
            return None
        args: list[str | int | float] = [lease, cost, self.lease_ms]
        for _, max_tokens, max_requests in candidates:
            args += [max_tokens, max_requests]
        chosen, tokens = await self._reserve([k for url, _, _ in candidates for k in keys(url)], args)
        return (int(chosen) - 1, int(tokens)) if chosen else None

    async def release(self, replica: str, leases: Sequence[str]) -> int:
        return int(await self._release(keys(replica), list(leases))) if leases else 0

    async def renew(self, replica: str, leases: Sequence[str]) -> int:
        return int(await self._renew(keys(replica)[:1], [self.lease_ms, *leases])) if leases else 0

    async def in_flight(self, replica: str) -> tuple[int, int]:
        """(tokens, requests) reserved on `replica` now, expired leases included until the next reservation."""
        tokens, requests = await self.link.call(lambda client: client.hmget(keys(replica)[2], "tokens", "requests"))
        return int(tokens or 0), int(requests or 0)

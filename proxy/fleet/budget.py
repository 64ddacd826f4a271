"""Each upstream replica's in-flight budget, shared in Redis by every guard and worker: reservations made and
released atomically by Lua scripts, each with a lease that its guard renews while the request runs.

Per replica (keyed by its URL), a sorted set of reservation id -> lease expiry, a hash of reservation id -> cost,
a hash of block id -> request slots, and a hash of the running totals. A reservation is one request (one slot); a
block is a process's credit, tokens and slots it admits requests on without asking again, resized by ADJUST. Every
script first drops the expired leases (a guard that died), by Redis's own clock, so guards' clocks never matter.
The same rules as the local gate: a request fits when the replica's request and token budgets both hold it, or when
the replica is idle (an oversized request runs alone); among the replicas it fits, it takes the one with the fewest
tokens in flight. A reservation that fits nowhere marks its replicas wanted for a moment: the holders of blocks
give back what they do not use.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.fleet.link import PREFIX, RedisLink

Candidate = tuple[str, int, int]  # a replica's URL, its whole token and request budgets (0: none)
Size = tuple[int, int]  # a block: tokens, request slots
WANTED_MS = 300  # how long a reservation that fit nowhere keeps its replicas wanted (its waiter retries sooner)

# Redis's clock, and free(leases, costs, slots, totals, ids): drop reservations and blocks, their totals with them;
# how many were still held.
COMMON = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local function free(leases, costs, slots, totals, ids)
  local tokens, requests, n = 0, 0, 0
  for _, id in ipairs(ids) do
    if redis.call('ZREM', leases, id) == 1 then
      tokens = tokens + tonumber(redis.call('HGET', costs, id) or '0')
      requests = requests + tonumber(redis.call('HGET', slots, id) or '1')
      redis.call('HDEL', costs, id)
      redis.call('HDEL', slots, id)
      n = n + 1
    end
  end
  if n > 0 then
    redis.call('HINCRBY', totals, 'tokens', -tokens)
    redis.call('HINCRBY', totals, 'requests', -requests)
  end
  return n
end
local function expire(leases, costs, slots, totals)
  free(leases, costs, slots, totals, redis.call('ZRANGEBYSCORE', leases, '-inf', now))
end
"""

# KEYS: (leases, costs, slots, totals, wanted) per candidate replica. ARGV: id, cost, lease ms, wanted ms, then (max
# tokens, max requests) per candidate (0: no such budget). Returns {chosen candidate (1-based, 0: none fits), its
# tokens in flight after}.
RESERVE = (
    COMMON
    + """
local id, cost, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local best, best_tokens, best_requests = 0, 0, 0
for i = 1, #KEYS / 5 do
  local leases, costs, slots, totals = KEYS[5 * i - 4], KEYS[5 * i - 3], KEYS[5 * i - 2], KEYS[5 * i - 1]
  expire(leases, costs, slots, totals)
  local tokens = tonumber(redis.call('HGET', totals, 'tokens') or '0')
  local requests = tonumber(redis.call('HGET', totals, 'requests') or '0')
  local max_tokens, max_requests = tonumber(ARGV[3 + 2 * i]), tonumber(ARGV[4 + 2 * i])
  local fits = (max_requests == 0 or requests < max_requests)
    and (max_tokens == 0 or tokens + cost <= max_tokens or requests == 0)
  if fits and (best == 0 or tokens < best_tokens or (tokens == best_tokens and requests < best_requests)) then
    best, best_tokens, best_requests = i, tokens, requests
  end
end
if best == 0 then
  for i = 1, #KEYS / 5 do redis.call('SET', KEYS[5 * i], '1', 'PX', tonumber(ARGV[4])) end
  return {0, 0}
end
redis.call('ZADD', KEYS[5 * best - 4], now + lease, id)
redis.call('HSET', KEYS[5 * best - 3], id, cost)
redis.call('HINCRBY', KEYS[5 * best - 1], 'tokens', cost)
redis.call('HINCRBY', KEYS[5 * best - 1], 'requests', 1)
return {best, best_tokens + cost}
"""
)

# KEYS: leases, costs, slots, totals of one replica. ARGV: reservation or block ids. Returns how many were held.
RELEASE = COMMON + "return free(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV)"

# KEYS: leases, costs, slots, totals, wanted of one replica. ARGV: block id, lease ms, the tokens and slots wished
# for, max tokens, max requests (0: no such budget). The block grows only into free budget and only while the
# replica is not wanted; it shrinks as wished (its process admits no more than the smaller size meanwhile). A block
# without a slot, or without tokens under a token budget, is dropped: it would hold budget and admit nothing.
# Returns {its tokens, its slots, 1 if the replica is wanted, the replica's tokens in flight}.
ADJUST = (
    COMMON
    + """
local leases, costs, slots, totals, wanted = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, lease = ARGV[1], tonumber(ARGV[2])
local new_t, new_s, max_t, max_r = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
expire(leases, costs, slots, totals)
local held_t = tonumber(redis.call('HGET', costs, id) or '0')
local held_s = tonumber(redis.call('HGET', slots, id) or '0')
local contended = redis.call('EXISTS', wanted)
if contended == 1 then new_t, new_s = math.min(new_t, held_t), math.min(new_s, held_s) end
local tokens = tonumber(redis.call('HGET', totals, 'tokens') or '0')
local requests = tonumber(redis.call('HGET', totals, 'requests') or '0')
if max_t > 0 and new_t > held_t then new_t = math.max(held_t, math.min(new_t, held_t + max_t - tokens)) end
if max_r > 0 and new_s > held_s then new_s = math.max(held_s, math.min(new_s, held_s + max_r - requests)) end
if new_s <= 0 or (max_t > 0 and new_t <= 0) then new_t, new_s = 0, 0 end
if new_t == 0 and new_s == 0 then
  free(leases, costs, slots, totals, {id})
else
  redis.call('ZADD', leases, now + lease, id)
  redis.call('HSET', costs, id, new_t)
  redis.call('HSET', slots, id, new_s)
  redis.call('HINCRBY', totals, 'tokens', new_t - held_t)
  redis.call('HINCRBY', totals, 'requests', new_s - held_s)
end
return {new_t, new_s, contended, tokens + new_t - held_t}
"""
)

# KEYS: leases of one replica. ARGV: lease ms, then reservation ids. Only leases still held are renewed (XX).
RENEW = (
    COMMON
    + """
local expiry = now + tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, ARGV[i]) end
return n
"""
)


def keys(replica: str) -> list[str]:
    base = f"{PREFIX}admission:{replica}:"
    return [base + "leases", base + "costs", base + "slots", base + "totals", base + "wanted"]


class FleetBudget:
    def __init__(self, link: RedisLink, lease_s: float) -> None:
        self.link, self.lease_ms = link, max(1, round(lease_s * 1000))
        self._reserve, self._release, self._renew = link.script(RESERVE), link.script(RELEASE), link.script(RENEW)
        self._adjust = link.script(ADJUST)

    async def reserve(self, lease: str, cost: int, candidates: Sequence[Candidate]) -> tuple[int, int] | None:
        """(index into `candidates`, that replica's tokens in flight with this one), or None when none has room.
        Raises FleetStateUnavailable."""
        if not candidates:
            return None
        args: list[str | int | float] = [lease, cost, self.lease_ms, WANTED_MS]
        for _, max_tokens, max_requests in candidates:
            args += [max_tokens, max_requests]
        chosen, tokens = await self._reserve([k for url, _, _ in candidates for k in keys(url)], args)
        return (int(chosen) - 1, int(tokens)) if chosen else None

    async def release(self, replica: str, leases: Sequence[str]) -> int:
        return int(await self._release(keys(replica)[:4], list(leases))) if leases else 0

    async def adjust(self, candidate: Candidate, block: str, wish: Size) -> tuple[Size, bool, int]:
        """Resize this process's block on one replica towards `wish` (renewing its lease): (what it holds now,
        whether the replica is wanted by a reservation that fit nowhere, the replica's tokens in flight).
        Raises FleetStateUnavailable."""
        url, max_tokens, max_requests = candidate
        args: list[str | int | float] = [block, self.lease_ms, *wish, max_tokens, max_requests]
        tokens, slots, wanted, in_flight = await self._adjust(keys(url), args)
        return (int(tokens), int(slots)), bool(wanted), int(in_flight)

    async def renew(self, replica: str, leases: Sequence[str]) -> int:
        return int(await self._renew(keys(replica)[:1], [self.lease_ms, *leases])) if leases else 0

    async def in_flight(self, replica: str) -> tuple[int, int]:
        """(tokens, requests) reserved on `replica` now, expired leases included until the next reservation."""
        tokens, requests = await self.link.call(lambda client: client.hmget(keys(replica)[3], "tokens", "requests"))
        return int(tokens or 0), int(requests or 0)

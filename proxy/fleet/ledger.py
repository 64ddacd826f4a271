"""The ledger of stored responses (policy/ledger.py) kept in Redis, so that every guard on one Redis knows which key
owns a response, which replica holds it and what conversation it continues. Each entry is a string that expires
after responses.ttl_s; an index (a sorted set by the time each was written, and a hash of their sizes) keeps the
entries' total size within responses.max_bytes, the oldest evicted first, in one Lua script.

When Redis does not answer, a lookup finds nothing and a write is skipped: a continued turn is then counted as
partial, and where the guard checks keys an id it cannot find is a 404 (fail closed: no key reaches another's
response because Redis was away)."""

from __future__ import annotations

import logging

from proxy.errors import FleetStateUnavailable
from proxy.fleet.link import PREFIX, RedisLink
from proxy.policy.ledger import Stored

log = logging.getLogger("token_guard.redis")

ENTRY = PREFIX + "response:"  # + the response id: its encoded entry
INDEX = PREFIX + "responses"  # sorted set: response id -> when it was written (Redis ms)
SIZES = PREFIX + "responses:sizes"  # hash: response id -> its entry's size
TOTAL = PREFIX + "responses:bytes"  # the sizes' sum

# KEYS: the entry, INDEX, SIZES, TOTAL. ARGV: id, encoded entry, ttl ms, the bound in bytes, ENTRY (the prefix of the
# entries evicted). Entries past their time are dropped from the index first; then the oldest until within the bound.
PUT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl, bound, size = tonumber(ARGV[3]), tonumber(ARGV[4]), string.len(ARGV[2])
local function forget(id)
  local held = redis.call('HGET', KEYS[3], id)
  if held then redis.call('DECRBY', KEYS[4], held) end
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('DEL', ARGV[5] .. id)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl)) do forget(id) end
forget(ARGV[1])
if size > bound then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], size)
local total = redis.call('INCRBY', KEYS[4], size)
while total > bound do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  forget(oldest[1])
  total = tonumber(redis.call('GET', KEYS[4]) or '0')
end
for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
return 1
"""

# KEYS: the entry, INDEX, SIZES, TOTAL. ARGV: id.
DROP = """
local held = redis.call('HGET', KEYS[3], ARGV[1])
if held then redis.call('DECRBY', KEYS[4], held) end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
"""


class RedisLedger:
    def __init__(self, link: RedisLink, ttl_s: float, max_bytes: int) -> None:
        self.link, self.ttl_ms, self.max_bytes = link, max(1, round(ttl_s * 1000)), max_bytes
        self._put, self._drop = link.script(PUT), link.script(DROP)

    async def find(self, response_id: str) -> Stored | None:
        try:
            raw = await self.link.call(lambda client: client.get(ENTRY + response_id))
        except FleetStateUnavailable:
            return None
        return Stored.decode(raw) if raw is not None else None

    async def put(self, entry: Stored) -> None:
        keys = [ENTRY + entry.id, INDEX, SIZES, TOTAL]
        try:
            await self._put(keys, [entry.id, entry.encode(), self.ttl_ms, self.max_bytes, ENTRY])
        except FleetStateUnavailable:
            log.warning("response %s not recorded: Redis does not answer", entry.id)

    async def drop(self, response_id: str) -> None:
        try:
            await self._drop([ENTRY + response_id, INDEX, SIZES, TOTAL], [response_id])
        except FleetStateUnavailable:
            pass

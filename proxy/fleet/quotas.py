"""Per-key quotas of the fleet, every guard on one Redis charging the same buckets: those of proxy/policy/quota.py,
checked and charged in one Lua script (so two guards never both spend the same tokens), on Redis's clock (so guards'
clocks may differ). A key's buckets live in one hash that expires once it would be full again: an idle key costs
nothing."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.fleet.link import PREFIX, RedisLink
from proxy.policy.quota import CHARGE, Limits, Verdict, Window

QUOTAS = PREFIX + "quota:"  # + the key's name: a hash of both buckets

# KEYS[1]: the key's hash. ARGV: token limit, request limit (0: no such limit), tokens to charge, requests to charge
# (0 and 0: a look), tokens to give back, and the mode (policy/quota.py: 0 charge, 1 take, 2 check). Returns allowed,
# then remaining and ms to full for tokens and requests, the ms to wait when refused, and 1 when the charge alone is
# over the token limit. Mirrors policy/quota.py.
BUCKETS = """
local t = redis.call('TIME')
local now = t[1] * 1000 + t[2] / 1000
local s = redis.call('HMGET', KEYS[1], 'tokens', 'tokens_at', 'requests', 'requests_at')
local limits = {tonumber(ARGV[1]), tonumber(ARGV[2])}
local costs = {tonumber(ARGV[3]), tonumber(ARGV[4])}
local mode = tonumber(ARGV[6])
local levels, waits = {}, {0, 0}
for i = 1, 2 do
  local limit = limits[i]
  local level = limit
  if limit > 0 and s[2 * i - 1] then
    level = math.min(limit, tonumber(s[2 * i - 1]) + math.max(0, now - tonumber(s[2 * i])) * limit / 60000)
  end
  levels[i] = level
  if limit > 0 then
    local need = 1
    if mode == 0 then need = costs[i] end
    if need > 0 and level < need then waits[i] = (need - level) * 60000 / limit end
  end
end
local too_large = 0
if mode == 0 and limits[1] > 0 and costs[1] > limits[1] then too_large = 1 end
local wait = math.max(waits[1], waits[2])
if too_large == 1 then wait = 0 end
local allowed = 0
if wait == 0 and too_large == 0 then
  allowed = 1
  if mode ~= 2 then
    levels[1] = math.min(limits[1], levels[1] - costs[1] + tonumber(ARGV[5]))
    levels[2] = levels[2] - costs[2]
  end
end
local out, expiry = {allowed}, 1000
for i = 1, 2 do
  local full = 0
  if limits[i] > 0 then full = (limits[i] - levels[i]) * 60000 / limits[i] end
  expiry = math.max(expiry, math.ceil(full) + 1000)
  out[#out + 1] = math.floor(levels[i])
  out[#out + 1] = math.ceil(full)
end
out[#out + 1] = math.ceil(wait)
out[#out + 1] = too_large
redis.call('HSET', KEYS[1], 'tokens', tostring(levels[1]), 'tokens_at', tostring(now),
           'requests', tostring(levels[2]), 'requests_at', tostring(now))
redis.call('PEXPIRE', KEYS[1], expiry)
return out
"""


class RedisQuotas:
    """The same calls as policy/quota.LocalQuotas, on Redis. Each raises FleetStateUnavailable when Redis does
    not answer in time."""

    def __init__(self, link: RedisLink) -> None:
        self._buckets = link.script(BUCKETS)

    async def charge(self, name: str, limits: Limits, cost: int, mode: int = CHARGE) -> Verdict:
        return await self._run(name, limits, cost, 1, 0, mode)

    async def give_back(self, name: str, limits: Limits, amount: int) -> Verdict | None:
        """The buckets after `amount` came back; None when there was nothing to give."""
        if limits[0] is not None and amount:
            return await self._run(name, limits, 0, 0, amount)
        return None

    async def peek(self, name: str, limits: Limits) -> Verdict:
        return await self._run(name, limits, 0, 0, 0)

    async def _run(
        self, name: str, limits: Limits, tokens: int, requests: int, back: int, mode: int = CHARGE
    ) -> Verdict:
        tokens_limit, requests_limit = limits
        args = [tokens_limit or 0, requests_limit or 0, tokens, requests, back, mode]
        out: Sequence[int] = await self._buckets([QUOTAS + name], args)
        allowed, tokens_left, tokens_full, requests_left, requests_full, wait, too_large = (int(x) for x in out)
        return Verdict(
            bool(allowed),
            _window(tokens_limit, tokens_left, tokens_full),
            _window(requests_limit, requests_left, requests_full),
            wait,
            fleet=True,
            too_large=bool(too_large),
        )


def _window(limit: int | None, remaining: int, reset_ms: int) -> Window | None:
    return None if limit is None else Window(limit, max(0, remaining), max(0, reset_ms))

"""Per-key quotas as token buckets (pure): each limit (tokens per minute, requests per minute) is a bucket holding at
most its limit, refilled continuously at limit/60 per second, so a key spends its minute's worth at any pace and
never gets a double minute at a window's edge. A request is charged in both buckets at once, or in neither. Three
ways to charge (`Mode`):

    CHARGE  a reservation made before forwarding (input + output cap): taken when both buckets hold it; refused
            when they do not yet (Retry-After: until they will), and refused outright when it is more than the
            whole limit (`too_large`: it could never be served, and must not leave the key minutes in debt)
    TAKE    work the guard already did (a count it answers, a prompt it refused after counting it): taken whole,
            into debt if need be, provided the key had something left (a token and a request) before it
    CHECK   whether the key has something left, charging nothing: the look before a large body is counted

The same math runs in Redis (its Lua twin in proxy/fleet/quotas.py).

OpenAI's headers: x-ratelimit-limit-*, -remaining-* (what is left after this request) and -reset-* (until the bucket
is full again, as "6m0s", "1s", "20ms")."""

from __future__ import annotations

import math
from dataclasses import dataclass

MINUTE_MS = 60_000


@dataclass
class Bucket:
    level: float  # what may still be spent; below 0 while the key is in debt
    at_ms: float  # when `level` was last brought up to date


@dataclass(frozen=True)
class Window:
    """One limit's state as the headers tell it."""

    limit: int
    remaining: int
    reset_ms: int


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    tokens: Window | None  # None: the key has no such limit
    requests: Window | None
    retry_after_ms: int = 0  # when refused: until both buckets could take the request
    fleet: bool = False  # from the fleet's buckets in Redis (else this process's): what is given back goes there too
    too_large: bool = False  # refused: the request alone is over the key's tokens per minute

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, window in (("requests", self.requests), ("tokens", self.tokens)):
            if window is not None:
                headers[f"x-ratelimit-limit-{kind}"] = str(window.limit)
                headers[f"x-ratelimit-remaining-{kind}"] = str(window.remaining)
                headers[f"x-ratelimit-reset-{kind}"] = duration(window.reset_ms)
        return headers

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.retry_after_ms / 1000))


Limits = tuple[int | None, int | None]  # a key's tokens and requests per minute (None: no such limit)
CHARGE, TAKE, CHECK = 0, 1, 2  # the ways to charge (module docstring); the Lua script takes the same numbers
Held = tuple[Bucket, int] | None  # a bucket and its limit, or None when the key has no such limit


def refill(bucket: Bucket, limit: int, now_ms: float) -> None:
    elapsed = max(0.0, now_ms - bucket.at_ms)
    bucket.level = min(float(limit), bucket.level + elapsed * limit / MINUTE_MS)
    bucket.at_ms = now_ms


def wait_ms(bucket: Bucket, limit: int, need: int) -> float:
    """Until `bucket` (brought up to date) holds `need`."""
    return max(0.0, (need - bucket.level) * MINUTE_MS / limit)


def window(bucket: Bucket, limit: int) -> Window:
    reset = (limit - bucket.level) * MINUTE_MS / limit
    return Window(limit, max(0, math.floor(bucket.level)), max(0, math.ceil(reset)))


def charge(tokens: Held, requests: Held, cost: int, now_ms: float, mode: int = CHARGE) -> Verdict:
    """Take `cost` tokens and one request, each from its (bucket, limit) when the key has that limit, as `mode`
    says (module docstring)."""
    for bucket, limit, _ in _all(tokens, requests):
        refill(bucket, limit, now_ms)
    if mode == CHARGE and tokens is not None and cost > tokens[1]:
        return _verdict(False, tokens, requests, 0.0, too_large=True)
    pairs = _pairs(tokens, requests, cost)
    needs = [(b, limit, c if mode == CHARGE else 1) for b, limit, c in pairs]
    wait = max((wait_ms(b, limit, need) for b, limit, need in needs if need > 0), default=0.0)
    if wait > 0:
        return _verdict(False, tokens, requests, wait)
    if mode != CHECK:
        for bucket, _, c in pairs:
            bucket.level -= c
    return _verdict(True, tokens, requests, 0.0)


def give_back(bucket: Bucket, limit: int, amount: int, now_ms: float) -> None:
    """Return what a request was charged and did not use (a negative amount charges what it used beyond that)."""
    refill(bucket, limit, now_ms)
    bucket.level = min(float(limit), bucket.level + amount)


def peek(tokens: Held, requests: Held, now_ms: float) -> Verdict:
    for bucket, limit, _ in _all(tokens, requests):
        refill(bucket, limit, now_ms)
    return _verdict(True, tokens, requests, 0.0)


def duration(ms: int) -> str:
    """OpenAI's reset format: "20ms" under a second, else minutes and seconds ("1s", "6m0s", "1m30.5s")."""
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, MINUTE_MS)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{minutes}m{seconds}" if minutes else seconds


def _pairs(tokens: Held, requests: Held, cost: int) -> list[tuple[Bucket, int, int]]:
    pairs = []
    if tokens is not None:
        pairs.append((tokens[0], tokens[1], cost))
    if requests is not None:
        pairs.append((requests[0], requests[1], 1))
    return pairs


def _all(tokens: Held, requests: Held) -> list[tuple[Bucket, int, int]]:
    return _pairs(tokens, requests, 0)


def _verdict(allowed: bool, tokens: Held, requests: Held, wait: float, too_large: bool = False) -> Verdict:
    return Verdict(
        allowed,
        window(*tokens) if tokens is not None else None,
        window(*requests) if requests is not None else None,
        math.ceil(wait),
        too_large=too_large,
    )


class LocalQuotas:
    """The buckets of one process. With `share` processes keeping to the same limits (the workers on one port, or
    the guards last seen sharing a Redis that stopped answering), each holds 1/share of every limit, so that together
    they keep to it. `share` may change between calls: a bucket never holds more than its new limit."""

    def __init__(self, share: int = 1) -> None:
        self.share = share
        self._buckets: dict[tuple[str, str], Bucket] = {}

    def mirror(self, name: str, limits: Limits, verdict: Verdict, now_ms: float) -> None:
        """What the fleet's buckets in Redis say a key has left, this process's share of it: where its own buckets
        start from should Redis stop answering, so that a key that spent its minute does not get another."""
        tokens, requests = self._pair(name, limits, now_ms)
        for held, window in ((tokens, verdict.tokens), (requests, verdict.requests)):
            if held is not None and window is not None:
                held[0].level = min(float(held[1]), window.remaining / self.share)
                held[0].at_ms = now_ms

    def charge(self, name: str, limits: Limits, cost: int, now_ms: float, mode: int = CHARGE) -> Verdict:
        return charge(*self._pair(name, limits, now_ms), cost, now_ms, mode)

    def give_back(self, name: str, limits: Limits, amount: int, now_ms: float) -> None:
        tokens, _ = self._pair(name, limits, now_ms)
        if tokens is not None and amount:
            give_back(tokens[0], tokens[1], amount, now_ms)

    def peek(self, name: str, limits: Limits, now_ms: float) -> Verdict:
        return peek(*self._pair(name, limits, now_ms), now_ms)

    def _pair(self, name: str, limits: Limits, now_ms: float) -> tuple[Held, Held]:
        tokens, requests = (None if limit is None else max(1, limit // self.share) for limit in limits)
        return self._bucket(name, "tokens", tokens, now_ms), self._bucket(name, "requests", requests, now_ms)

    def _bucket(self, name: str, kind: str, limit: int | None, now_ms: float) -> Held:
        if limit is None:
            return None
        bucket = self._buckets.get((name, kind))
        if bucket is None:
            bucket = self._buckets[name, kind] = Bucket(float(limit), now_ms)
        return bucket, limit

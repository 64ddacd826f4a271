"""A keyed request's quota along its path (quotas.py holds the buckets): charged what it reserves before it goes
upstream, charged what counting cost when it goes nowhere, checked before heavy work, told on every answer, and
settled against what its answer says it used (policy/usage.py). Each charge and tell gives back the verdict or headers
the request's answers carry (exchange/request.py keeps them); nothing here writes into a caller's headers."""

from __future__ import annotations

from proxy.exchange.headers import Headers, encode_headers
from proxy.exchange.quotas import Quotas
from proxy.exchange.record import RequestRecord
from proxy.policy.quota import Verdict
from proxy.policy.usage import Charge
from proxy.settings.sections import KeySettings


class Meter:
    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas

    async def charge(self, key: KeySettings, tokens: int, mode: int, record: RequestRecord) -> Verdict:
        """One charge of a key's quotas (policy/quota.py: CHARGE, TAKE or CHECK); the verdict, whose headers the
        answer carries either way. A refusal is the caller's to raise (quotas.over_quota)."""
        verdict = await self.quotas.charge(key, tokens, mode)
        record.quota_told = True
        if not verdict.allowed:
            record.quota_limited = True
            record.charged_tokens = None
        return verdict

    async def tell(self, key: KeySettings, record: RequestRecord) -> Headers:
        """Where a key stands, for an answer that charged nothing: its x-ratelimit-* headers."""
        told = encode_headers(await self.quotas.told(key))
        record.quota_told = bool(told)
        return told

    async def settle(self, charge: Charge, record: RequestRecord, status: int | None, gone: bool) -> None:
        """Give back what the request did not use, once its answer ended with `status` (None: none began); `gone`:
        its client left before the answer's end (policy/usage.py says what it pays then)."""
        unused = charge.unused(status, gone)
        record.charged_tokens = charge.tokens - unused
        if unused:
            await self.quotas.give_back(charge.key, unused, charge.fleet)

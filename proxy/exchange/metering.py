"""A keyed request's quota along its path (quotas.py holds the buckets): charged what it reserves before it goes
upstream, charged what counting cost when it goes nowhere, checked before heavy work, told on every answer, and
settled against what its answer says it used (policy/usage.py). Every answer carries the key's x-ratelimit-* headers,
kept in the request's `tagged` headers as they change."""

from __future__ import annotations

from proxy.exchange.headers import Headers, encode_headers
from proxy.exchange.quotas import Quotas, over_quota
from proxy.exchange.record import RequestRecord
from proxy.policy.outcome import Chunked, Forward, Outcome
from proxy.policy.quota import CHARGE, TAKE, Verdict
from proxy.policy.usage import Charge
from proxy.settings.sections import KeySettings


class Meter:
    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas

    async def charge_outcome(self, key: KeySettings, outcome: Outcome, record: RequestRecord, tagged: Headers) -> None:
        """Charge a keyed request what it reserves before it is forwarded (input + output cap, the KV cost admission
        uses), settled later against its answer's usage; a request the guard answers itself (count_tokens), forwards
        only to be rendered, or refuses once counted, is charged the tokens it counted: counting is work done."""
        tokens = outcome.cost if isinstance(outcome, Forward) else sum(outcome.costs) if isinstance(outcome, Chunked) \
            else None  # fmt: skip
        if tokens is None:
            record.charged_tokens = outcome.decision.prompt_tokens
            await self.charge(key, outcome.decision.prompt_tokens, TAKE, record, tagged)
            return
        verdict = await self.charge(key, tokens, CHARGE, record, tagged)
        asked = isinstance(outcome, Forward) and outcome.usage_asked
        record.charge = Charge(key, tokens, outcome.decision.prompt_tokens, verdict.fleet, asked)

    async def charge(self, key: KeySettings, tokens: int, mode: int, record: RequestRecord, tagged: Headers) -> Verdict:
        """One charge of a key's quotas (policy/quota.py: CHARGE, TAKE or CHECK); 429 when refused. The answer
        carries the key's x-ratelimit-* headers either way."""
        verdict = await self.quotas.charge(key, tokens, mode)
        tagged[:] = [h for h in tagged if not h[0].startswith(b"x-ratelimit-")] + encode_headers(verdict.headers())
        record.quota_told = True
        if not verdict.allowed:
            record.quota_limited = True
            record.charged_tokens = None
            raise over_quota(key, verdict, max(tokens, 1))
        return verdict

    async def tell(self, key: KeySettings | None, record: RequestRecord, tagged: Headers) -> None:
        """Every answer to a keyed request says where its key stands, errors and pass-through routes included."""
        if key is None or not key.limited or record.quota_told:
            return
        told = await self.quotas.told(key)
        tagged.extend(encode_headers(told))
        record.quota_told = bool(told)

    async def settle(self, charge: Charge, record: RequestRecord, status: int | None, gone: bool) -> None:
        """Give back what the request did not use, once its answer ended with `status` (None: none began); `gone`:
        its client left before the answer's end (policy/usage.py says what it pays then)."""
        unused = charge.unused(status, gone)
        record.charged_tokens = charge.tokens - unused
        if unused:
            await self.quotas.give_back(charge.key, unused, charge.fleet)

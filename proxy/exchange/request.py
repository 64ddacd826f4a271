"""One request as either front end holds it, built once when the route table lets it in: its route and key, the
record its log line and metrics are made from (what the guard found and decided), the headers every answer carries,
its key's charge, the stored response it creates or names; and the bookkeeping of its answer, the same whatever wire
it came by (admission's wait, the upstream's status, the ticket given back or handed to the followers, the charge
settled, the record finished)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from proxy.api.routes import Route
from proxy.exchange.background import Followed
from proxy.exchange.checked import check_count
from proxy.exchange.core import Core
from proxy.exchange.headers import Headers, RawHeaders, encode_headers
from proxy.exchange.quotas import over_quota
from proxy.exchange.record import REQUEST_ID, RequestRecord
from proxy.exchange.stored import Recorder, named_id, owner_of, reach, recorder_for
from proxy.policy.ledger import Stored
from proxy.policy.outcome import Chunked, Forward, Outcome
from proxy.policy.quota import CHARGE, TAKE, Verdict
from proxy.policy.usage import Charge
from proxy.settings.sections import KeySettings
from proxy.upstream.admission import Ticket

QUEUE_HEADER = b"x-token-guard-queue-ms"
RESPONSES = "/v1/responses"


@dataclass(eq=False, slots=True)
class Request:
    core: Core
    route: Route
    key: KeySettings | None  # the client's named API key ([[keys]]), when it has one
    record: RequestRecord
    rate: Headers = field(default_factory=list)  # the key's x-ratelimit-*, as its last charge left them
    decided: Headers = field(default_factory=list)  # the decision's x-token-guard-*, once decided
    queued: Headers = field(default_factory=list)  # how long it waited for admission, when it waited
    recorder: Recorder | None = None  # the stored response it creates or names (exchange/stored.py)

    @classmethod
    def begin(
        cls, core: Core, route: Route, key: KeySettings | None, request_id: str, method: str, guarded: bool,
        headers: RawHeaders,
    ) -> Request:  # fmt: skip
        record = RequestRecord(request_id, method, route.path, guarded)
        record.findings.api_key = key
        if route.path.startswith(RESPONSES):  # stored responses belong to the key that created them
            record.findings.owner = owner_of(core.keys, headers)
        return cls(core, route, key, record)

    @property
    def tagged(self) -> Headers:
        """What every answer carries, errors included: the request id, and the key's x-ratelimit-* once charged."""
        return [(REQUEST_ID, self.record.request_id.encode()), *self.rate]

    @property
    def headers(self) -> Headers:
        """What an answer to the decided request carries: `tagged`, the decision's headers and the queue time."""
        return [*self.tagged, *self.decided, *self.queued]

    @property
    def limited(self) -> bool:
        return self.key is not None and self.key.limited

    async def charge(self, tokens: int, mode: int) -> Verdict:
        """One charge of the key's quotas (policy/quota.py: CHARGE, TAKE or CHECK); 429 when refused. Either way
        every answer then carries the key's x-ratelimit-* headers as the charge left them."""
        assert self.key is not None
        verdict = await self.core.meter.charge(self.key, tokens, mode, self.record)
        self.rate = encode_headers(verdict.headers())
        if not verdict.allowed:
            raise over_quota(self.key, verdict, max(tokens, 1))
        return verdict

    async def charge_one(self) -> None:
        """A request the guard does not count (relay, a stored response's route): one request, no token."""
        await self.charge(0, CHARGE)

    async def admitted_for(self, cost: int, excluded: frozenset[int]) -> Ticket:
        """A ticket from the admission gate for `cost` KV tokens, on a replica not `excluded` (429 when refused)."""
        gate = self.core.upstream.admission
        return gate.try_acquire(cost, excluded) or await gate.acquire(cost, excluded)

    async def charge_outcome(self, outcome: Outcome) -> None:
        """Charge the key what the request reserves before it is forwarded (input + output cap, the KV cost admission
        uses), settled later against its answer's usage; a request the guard answers itself (count_tokens), forwards
        only to be rendered, or refuses once counted, is charged the tokens it counted: counting is work done."""
        tokens = outcome.cost if isinstance(outcome, Forward) else sum(outcome.costs) if isinstance(outcome, Chunked) \
            else None  # fmt: skip
        prompt = outcome.decision.prompt_tokens
        if tokens is None:
            self.record.charged_tokens = prompt
            await self.charge(prompt, TAKE)
            return
        verdict = await self.charge(tokens, CHARGE)
        asked = isinstance(outcome, Forward) and outcome.usage_asked
        assert self.key is not None
        self.record.charge = Charge(self.key, tokens, prompt, verdict.fleet, asked)

    async def tell(self) -> None:
        """Every answer to a keyed request says where its key stands, errors and pass-through routes included."""
        if self.key is not None and self.key.limited and not self.record.quota_told:
            self.rate = [*self.rate, *await self.core.meter.tell(self.key, self.record)]

    async def reached(self, path: str) -> Stored | None:
        """A retrieve or cancel of a stored response: its key's only, answered by the replica that holds it (exchange/
        stored.py); the entry, None for any other route or a response the ledger does not know."""
        response_id = named_id(self.route, path)
        if response_id is None:
            return None
        entry = await reach(self.core.ledger, response_id, self.record.findings.owner)
        self.recorder = Recorder(self.core.ledger, None, entry, 0, False)
        return entry

    def recording(self) -> Recorder | None:
        """The ledger's reader of the answer to a Responses create vLLM stores (None for any other request)."""
        self.recorder = recorder_for(self.core.ledger, self.record.findings, self.core.settings.responses.max_bytes)
        return self.recorder

    def admitted(self, ticket: Ticket | None) -> None:
        """Admission let it go upstream: the time it waited is logged, and told in x-token-guard-queue-ms."""
        if ticket is not None and ticket.waited_s > 0:
            self.record.queue_s = ticket.waited_s
            self.queued = [(QUEUE_HEADER, str(round(ticket.waited_s * 1000)).encode())]

    def answered(self, status: int) -> None:
        """The upstream's answer began with `status`."""
        self.record.upstream_first_byte_s = time.perf_counter() - self.record.started
        if status >= 500:
            self.record.upstream_error = f"http_{status}"

    def let_go(self, ticket: Ticket | None, follows: str | None, replica: str | None, sent: dict[str, str]) -> None:
        """The answer ended: the admission ticket is released; but a background response vLLM took (`follows`, on
        `replica`) runs on after its answer, so its ticket and the key's charge go to the core's followers (exchange/
        background.py), polling with the credentials `sent` upstream, held until vLLM says it ended."""
        if follows is None or replica is None:
            self.core.upstream.release(ticket)
            return
        credentials = self.core.upstream.credentials_of(sent)
        self.core.followers.follow(Followed(follows, replica, credentials, ticket, self.record.charge, self.record))
        self.record.charge = None  # settled by the follower, once vLLM says what it used

    async def end(self, status: int | None, cut: bool, gone: bool) -> None:
        """The request's answer ended with `status` (None: none was sent; `cut`: before its last byte): its key's
        charge is settled (`gone`: its client left, policy/usage.py says what it pays then), its count checked against
        the usage the answer reports (exchange/checked.py), its record logged and counted."""
        if self.record.charge is not None:  # no coroutine for requests without a quota: the hot path
            await self.core.meter.settle(self.record.charge, self.record, status, gone)
        check_count(self.record, status, self.core.evidence)
        self.core.flow.done(self.record, status, cut)

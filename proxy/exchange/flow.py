"""The steps of a request's path that do not depend on the wire it came by: a guarded body decided by the guard with
its key's quota (checked before heavy work, charged on the outcome), and the request's record finished into its log
line and metrics. Each front end (server/ for HTTP, extproc/ for Envoy) reads the request, then does what the
outcome says in its own way."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from proxy.errors import GuardError
from proxy.exchange.headers import encode_headers
from proxy.exchange.logs import write_line
from proxy.exchange.metering import Meter
from proxy.exchange.metrics import Metrics
from proxy.exchange.readiness import Learning
from proxy.exchange.record import RequestRecord, log_fields, log_line
from proxy.exchange.turnstile import Turnstile
from proxy.policy.guard import Guard
from proxy.policy.outcome import Forward, Outcome
from proxy.policy.quota import CHECK, TAKE
from proxy.policy.usage import AnswerTail

if TYPE_CHECKING:
    from proxy.exchange.request import Request

requests_log = logging.getLogger("token_guard.requests")

HEAVY_BYTES = 8192  # bodies larger than this take turns on the event loop (turnstile.py); small ones never wait


class Flow:
    def __init__(self, guard: Guard, meter: Meter, metrics: Metrics, learning: Learning | None = None) -> None:
        """`learning`: what the guard must know before it counts (readiness.py); None: it knows already."""
        self.guard, self.meter, self.metrics, self.learning = guard, meter, metrics, learning
        self.turnstile = Turnstile()

    async def decide(
        self, request: Request, body: bytes, headers: Mapping[str, str], still_there: Callable[[], None],
        hides_usage: bool = False,
    ) -> Outcome:  # fmt: skip
        """The guard's outcome for a guarded request, charged to its key; the request keeps the decision's
        x-token-guard-* headers for its answer. `still_there` raises when the client has left: nothing is counted for
        a client that left while its request waited its turn. `hides_usage`: the front end can take a usage event out
        of the answer, so a limited key's stream asks vLLM for one (policy/usage_event.py) to settle exactly."""
        if self.learning is not None:  # nothing is counted before the guard knows how the upstream counts
            await self.learning.wait()
            still_there()
        limited = request.limited
        if len(body) > HEAVY_BYTES:  # a large prompt's counting holds the loop for milliseconds: take turns
            if limited:  # and is work: a key with nothing left gets nothing counted
                await request.charge(0, CHECK)
            await self.turnstile.enter()
        still_there()
        try:
            outcome = await self.guard.handle(request.route, body, headers, request.record.findings,
                                              hides_usage and limited)  # fmt: skip
        except GuardError as exc:
            if limited and exc.status < 500:
                await request.charge(0, TAKE)  # a request refused unread still is a request
            raise
        if limited:
            await request.charge_outcome(outcome)
        record = request.record
        if record.charge is None and isinstance(outcome, Forward) and record.checked:
            record.evidence = AnswerTail()  # its usage compared with the count (drift/evidence.py)
        request.decided = encode_headers(outcome.decision.headers())
        return outcome

    def done(self, record: RequestRecord, status: int | None, gone: bool) -> None:
        """The request's answer ended with `status` (None: none was sent; `gone`: its client left before its end)."""
        record.client_gone = record.client_gone or gone
        record.finish(status if status is not None else 499)
        self.metrics.observe(record)
        if requests_log.isEnabledFor(logging.INFO):
            fields = log_fields(record)
            write_line(requests_log, log_line(fields), fields)

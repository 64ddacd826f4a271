"""The steps of a request's path that do not depend on the wire it came by: a guarded body decided by the guard with
its key's quota (checked before heavy work, charged on the outcome), and the request's record finished into its log
line and metrics. Each front end (server/ for HTTP, extproc/ for Envoy) reads the request, then does what the
outcome says in its own way."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from proxy.api.routes import Route
from proxy.errors import GuardError
from proxy.exchange.headers import Headers, encode_headers
from proxy.exchange.logs import write_line
from proxy.exchange.metering import Meter
from proxy.exchange.metrics import Metrics
from proxy.exchange.readiness import Learning
from proxy.exchange.record import RequestRecord, log_fields, log_line
from proxy.exchange.turnstile import Turnstile
from proxy.policy.guard import Guard
from proxy.policy.outcome import Outcome
from proxy.policy.quota import CHECK, TAKE

requests_log = logging.getLogger("token_guard.requests")

HEAVY_BYTES = 8192  # bodies larger than this take turns on the event loop (turnstile.py); small ones never wait


class Flow:
    def __init__(self, guard: Guard, meter: Meter, metrics: Metrics, learning: Learning | None = None) -> None:
        """`learning`: what the guard must know before it counts (readiness.py); None: it knows already."""
        self.guard, self.meter, self.metrics, self.learning = guard, meter, metrics, learning
        self.turnstile = Turnstile()

    async def decide(
        self, route: Route, body: bytes, headers: Mapping[str, str], record: RequestRecord, tagged: Headers,
        still_there: Callable[[], None], hides_usage: bool = False,
    ) -> tuple[Outcome, Headers]:  # fmt: skip
        """The guard's outcome for a guarded request, charged to its key, and the headers its answer carries (`tagged`
        and the decision's x-token-guard-*). `still_there` raises when the client has left: nothing is counted for a
        client that left while its request waited its turn. `hides_usage`: the front end can take a usage event out
        of the answer, so a limited key's stream asks vLLM for one (policy/usage_event.py) to settle exactly."""
        if self.learning is not None:  # nothing is counted before the guard knows how the upstream counts
            await self.learning.wait()
            still_there()
        key = record.findings.api_key
        limited = key is not None and key.limited
        if len(body) > HEAVY_BYTES:  # a large prompt's counting holds the loop for milliseconds: take turns
            if key is not None and limited:  # and is work: a key with nothing left gets nothing counted
                await self.meter.charge(key, 0, CHECK, record, tagged)
            await self.turnstile.enter()
        still_there()
        try:
            outcome = await self.guard.handle(route, body, headers, record.findings, hides_usage and limited)
        except GuardError as exc:
            if key is not None and limited and exc.status < 500:
                await self.meter.charge(key, 0, TAKE, record, tagged)  # a request refused unread still is a request
            raise
        if key is not None and limited:
            await self.meter.charge_outcome(key, outcome, record, tagged)
        return outcome, tagged + encode_headers(outcome.decision.headers())

    def done(self, record: RequestRecord, status: int | None, gone: bool) -> None:
        """The request's answer ended with `status` (None: none was sent; `gone`: its client left before its end)."""
        record.client_gone = record.client_gone or gone
        record.finish(status if status is not None else 499)
        self.metrics.observe(record)
        if requests_log.isEnabledFor(logging.INFO):
            fields = log_fields(record)
            write_line(requests_log, log_line(fields), fields)

"""The upstream side: one or more vLLM replicas of the same model behind one transport (one connection pool).

A request goes to the replica with the fewest in-flight tokens (through the admission gate when a budget is set).
A replica that refuses connections or times out connecting is taken out for a growing back-off and comes back when
`GET /health` answers 200. A request is retried on another replica only for a connect failure, a 503, or a stream
that opens with one of vLLM's refusals (refusals.py: a full queue, a paused, faulted or leaving engine), and only
before anything was sent to the client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from proxy.errors import GuardError, UpstreamConnectTimeout, UpstreamRefused, UpstreamUnavailable
from proxy.settings import AdmissionSettings, RedisSettings, UpstreamSettings
from proxy.upstream.admission import Admission, Budget, Ticket, kv_capacity
from proxy.upstream.headers import CREDENTIAL_HEADERS, Credentials, forwardable, outgoing, upstream_auth
from proxy.upstream.refusals import refusal
from proxy.upstream.transport import GET_BYTES, METRICS_BYTES, Answer, Transport

if TYPE_CHECKING:
    from proxy.fleet.link import RedisLink
    from proxy.upstream.fleet_gate import FleetAdmission

log = logging.getLogger("token_guard.upstream")

MAX_BACKOFF_S = 30.0
NONE: frozenset[int] = frozenset()  # no replica excluded


@dataclass
class Replica:
    url: str
    budget: Budget  # this process's share, and its requests in flight
    whole: Budget = field(default_factory=Budget)  # the whole budget: what guards sharing a Redis divide between them
    failures: int = 0
    down_until: float = 0.0
    index: int = 0  # its place in upstream.urls: what clients may see of it (metrics), where the address is not

    def __str__(self) -> str:
        return f"replica {self.index} ({self.url})"  # for the guard's own log lines

    def take_out(self) -> None:
        self.failures += 1
        self.budget.available = False
        self.down_until = time.monotonic() + min(2.0 ** (self.failures - 1), MAX_BACKOFF_S)

    def bring_back(self) -> None:
        self.failures = 0
        self.budget.available = True


@dataclass
class Opened:
    response: Answer
    ticket: Ticket | None
    replica: str


class Upstream:
    def __init__(
        self,
        settings: UpstreamSettings,
        transport: Transport,
        admission: AdmissionSettings | None = None,
        workers: int = 1,
        link: RedisLink | None = None,
        redis: RedisSettings | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`transport`: the HTTP client toward the replicas (http.HttpClient when serving), closed by aclose().
        `workers`: processes serving the same port, each with its own gate: each takes 1/workers of a budget.
        `link`: the Redis that guards share budgets through (`redis`, its settings): each reserves from the whole.
        `credentials`: what becomes of a request's own (None: upstream.api_key replaces them, if set)."""
        admission = admission or AdmissionSettings()
        self.workers = workers
        tokens = admission.max_inflight_tokens if isinstance(admission.max_inflight_tokens, int) else 0
        whole = (tokens, admission.max_inflight_requests)
        share = Budget(_share(whole[0], workers), _share(whole[1], workers))
        self.replicas = [Replica(url, replace(share), Budget(*whole), index=i) for i, url in enumerate(settings.urls)]
        self.urls = settings.urls
        self.settings = settings
        self.auto_budget = admission.max_inflight_tokens == "auto"
        local = Admission([r.budget for r in self.replicas], admission.queue_timeout_s, admission.max_queue)
        self.admission: Admission | FleetAdmission = local
        budgeted = self.auto_budget or any(whole)
        if link is not None and budgeted:  # imported only here: without a Redis, redis is never imported
            from proxy.upstream.fleet_gate import FleetAdmission

            wholes = [r.whole for r in self.replicas]
            self.admission = FleetAdmission(local, self.urls, wholes, link, admission, redis or RedisSettings())
        self._transport = transport
        self.returned: Callable[[], None] = lambda: None  # told when a replica that was out answers again
        self._own = upstream_auth(settings.api_key)  # the guard's own calls (discovery, health, metrics)
        self.credentials = credentials or Credentials.of(settings.api_key, checks_keys=False)

    @property
    def where(self) -> str:
        """The replicas' URLs, for the guard's own log lines and the check (never for what a client sees)."""
        return ", ".join(self.urls)

    async def open(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes, cost: int | None = None, query: str = "",
        handed: Callable[[bool], None] | None = None, pin: str | None = None,
    ) -> Opened:  # fmt: skip
        """Send the request (`path`: a declared route's, `query` as the client sent it) and return once a replica's
        status and headers have arrived (body unread). With a `cost`, the request first passes the admission gate;
        the returned ticket must be released by the caller. `handed` is told each time the request leaves for a
        replica (True, once admitted) and each time that replica could not be reached after all (False). `pin`: the
        URL of the one replica that may answer (it holds a stored response), tried once, never another; one that is
        not among the replicas raises UpstreamRefused."""
        only = self._pinned(pin)
        tried: set[int] = set()
        for attempt in range(self.settings.retries + 1):
            last = attempt == self.settings.retries or len(tried) + 1 >= len(self.replicas) or only is not None
            ticket, index = await self._choose(cost, tried, only)
            replica = self.replicas[index]
            sent = outgoing(forwardable(headers), self.credentials)
            if handed is not None:
                handed(True)
            try:
                response = await self._transport.open(method, replica.url, path, query, sent, body)
            except (UpstreamRefused, UpstreamConnectTimeout) as exc:
                if handed is not None:
                    handed(False)
                self._release(ticket)
                replica.take_out()
                log.warning("%s taken out for %.0f s: %s", replica, replica.down_until - time.monotonic(),
                            exc.message)  # fmt: skip
                if last:
                    raise
                tried.add(index)
                continue
            except GuardError as exc:
                self._release(ticket)
                log.warning("%s failed a request: %s", replica, exc.message)
                raise
            except BaseException:
                self._release(ticket)
                raise
            if replica.failures:  # tried while out (every replica was), and it answered: it is back
                self._back(replica)
            if (response.status == 503 or response.is_sse) and not await self._keeps(response, ticket, last, cost):
                tried.add(index)  # only these can be vLLM's refusals: the usual answer costs no coroutine here
                continue
            return Opened(response, ticket, replica.url)
        raise UpstreamUnavailable("No upstream replica could take the request.")

    async def _keeps(self, response: Answer, ticket: Ticket | None, last: bool, cost: int | None) -> bool:
        """Whether to answer with this response; False: closed, try another replica (a 503, or one of vLLM's
        refusals). When the last replica tried refuses, the client gets the refusal's retryable error with
        Retry-After (refusals.py: 429 for a full queue, as for ours; 503 for a paused, faulted or leaving engine)."""
        try:
            refused = await refusal(response)
        except BaseException:  # the client went away, or the upstream broke off, while its first piece was read
            response.close()
            self._release(ticket)
            raise
        if refused is None and (response.status != 503 or last):
            return True
        response.close()
        self._release(ticket)
        if last and refused is not None:
            raise refused.error(self.admission.retry_after(cost or 0))
        return False

    def _pinned(self, pin: str | None) -> int | None:
        if pin is None:
            return None
        for index, replica in enumerate(self.replicas):
            if replica.url == pin:
                return index
        raise UpstreamRefused("The replica that holds the stored response is not one of this guard's.")

    async def _choose(self, cost: int | None, tried: set[int], only: int | None = None) -> tuple[Ticket | None, int]:
        if only is not None:  # a stored response is on its replica or nowhere: never another
            if not self.replicas[only].budget.available:
                raise UpstreamRefused(f"{self.replicas[only]} is out, and it holds the stored response.")
            up = {only}
        else:
            up = {i for i, r in enumerate(self.replicas) if r.budget.available and i not in tried}
        if not up:  # every replica is out: try the one that failed longest ago rather than refuse outright
            rest = [i for i in range(len(self.replicas)) if i not in tried] or list(range(len(self.replicas)))
            up = {min(rest, key=lambda i: self.replicas[i].down_until)}
            self.replicas[next(iter(up))].budget.available = True
        exclude = NONE if len(up) == len(self.replicas) else frozenset(set(range(len(self.replicas))) - up)
        if cost is not None:  # guarded requests always pass the gate: without budgets it only counts, and routes
            ticket = self.admission.try_acquire(cost, exclude) or await self.admission.acquire(cost, exclude)
            return ticket, ticket.replica
        return None, min(up, key=lambda i: (self.replicas[i].budget.tokens, self.replicas[i].budget.requests))

    def ceiling(self) -> int | None:
        """The most KV tokens one request may hold: the largest replica's whole token budget; None when some replica
        has none (admission.max_inflight_tokens off, or "auto" not learned for it)."""
        budgets = [replica.whole.max_tokens for replica in self.replicas]
        return None if not all(budgets) else max(budgets)

    def release(self, ticket: Ticket | None) -> None:
        self._release(ticket)

    def replica_of(self, ticket: Ticket | None) -> str | None:
        """The URL of the replica a ticket admitted a request to."""
        return None if ticket is None else self.replicas[ticket.replica].url

    def credentials_of(self, headers: Mapping[str, str]) -> dict[str, str]:
        """The credentials a request's headers carry upstream (upstream.api_key's, or the client's own where the
        guard checks no key): what the guard's own follow-up calls on that request's behalf send."""
        sent = outgoing(forwardable(headers), self.credentials)
        return {k: v for k, v in sent.items() if k.lower() in CREDENTIAL_HEADERS}

    async def look(self, replica: str, path: str, headers: Mapping[str, str], timeout_s: float, limit: int) -> tuple[
            int, bytes]:  # fmt: skip
        """A GET on one replica (`replica`: its URL), read whole: status and at most `limit` bytes."""
        return await self._transport.get(replica, path, headers, timeout_s, limit)

    def _release(self, ticket: Ticket | None) -> None:
        if ticket is not None:
            self.admission.release(ticket)

    async def get_json(self, path: str, timeout_s: float) -> object:
        errors: list[GuardError] = []
        for replica in self._by_health():
            try:
                status, raw = await self._transport.get(replica.url, path, self._own, timeout_s, GET_BYTES)
            except GuardError as exc:
                errors.append(exc)
                continue
            if not 200 <= status < 300:
                errors.append(UpstreamUnavailable(f"The upstream at {replica.url} answered {path} with HTTP {status}."))
                continue
            try:
                return json.loads(raw)
            except ValueError:
                errors.append(UpstreamUnavailable(f"The upstream at {replica.url} answered {path} with invalid JSON."))
        raise errors[0]

    async def get_text(self, replica: str, path: str, timeout_s: float = 5.0, limit: int = GET_BYTES) -> str | None:
        try:
            status, raw = await self._transport.get(replica, path, self._own, timeout_s, limit)
        except GuardError as exc:
            log.warning("replica %s: GET %s failed: %s", replica, path, exc.message)
            return None
        return raw.decode(errors="replace") if status == 200 else None

    async def is_healthy(self, timeout_s: float = 2.0) -> bool:
        """True when at least one replica answers GET /health with 200; a replica that was out and answers is back."""
        results = await asyncio.gather(*(self._health(r, timeout_s) for r in self.replicas))
        for replica, healthy in zip(self.replicas, results, strict=True):
            if healthy and not replica.budget.available:
                self._back(replica)
        return any(results)

    async def _health(self, replica: Replica, timeout_s: float) -> bool:
        try:
            status, _ = await self._transport.get(replica.url, "/health", self._own, timeout_s, GET_BYTES)
        except GuardError:
            return False
        return status == 200

    async def watch_health(self) -> None:
        """Bring taken-out replicas back once their back-off has passed and GET /health answers 200."""
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            now = time.monotonic()
            for replica in self.replicas:
                if replica.budget.available or replica.down_until > now:
                    continue
                if await self._health(replica, 2.0):
                    self._back(replica)
                else:
                    replica.take_out()

    def _back(self, replica: Replica) -> None:
        replica.bring_back()
        log.info("%s is healthy again", replica)
        self.admission.wake()
        self.returned()

    async def learn_budgets(self) -> None:
        """admission.max_inflight_tokens = "auto": each replica's KV cache size from its Prometheus metrics."""
        for replica in self.replicas:
            capacity = kv_capacity(await self.get_text(replica.url, "/metrics", limit=METRICS_BYTES) or "")
            if capacity is None:
                log.warning("%s does not expose vllm:cache_config_info; admission by tokens is off for it",
                            replica)  # fmt: skip
            else:
                replica.whole.max_tokens = capacity
                replica.budget.max_tokens = _share(capacity, self.workers)
                log.info("%s: KV budget %d tokens (from vllm:cache_config_info), %d for this worker",
                         replica, capacity, replica.budget.max_tokens)  # fmt: skip

    def _by_health(self) -> list[Replica]:
        return sorted(self.replicas, key=lambda r: (not r.budget.available, r.down_until))

    def fleet_jobs(self) -> list[Callable[[], Coroutine[Any, Any, None]]]:
        """The fleet gate's background work (redis.url): releases, waiters, leases, heartbeat."""
        return [] if isinstance(self.admission, Admission) else [self.admission.run]

    async def aclose(self) -> None:
        if not isinstance(self.admission, Admission):
            await self.admission.aclose()
        await self._transport.aclose()


def _share(budget: int, workers: int) -> int:
    """One worker's share of a budget (0 stays 0: off); at least 1, so that every worker can admit something."""
    return max(1, budget // workers) if budget else 0

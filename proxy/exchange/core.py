"""What every front end serves requests with, built once from the settings: the upstream (model discovery, health, KV
budgets, admission), the guard, the quotas, the metrics, the keys, the route table, the bytes of request bodies held
at once, the drain and the child processes (a request's own chat template renders in one, the largest bodies are
parsed in another); and the background work of its lifetime (learning the upstream's models, watching replicas'
health, reading KV budgets, the Redis link, following background responses).

`async with Core(...) as core:` is its lifetime: the background work runs inside the block, and on its way out the
work is cancelled and everything the core opened is closed (the HTTP client, the Redis link, the child processes).
A front end drains its requests inside the block, before the core's resources go."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

from proxy.api.models import ModelCard
from proxy.api.routes import RouteTable, render_only
from proxy.counting.isolated import BodyParser, IsolatedRenderer
from proxy.counting.registry import ModelRegistry
from proxy.drift.evidence import Evidence
from proxy.drift.startup import drift_warnings
from proxy.errors import GuardError
from proxy.exchange.background import Followers
from proxy.exchange.bodies import BodyBudget
from proxy.exchange.drain import Drain
from proxy.exchange.entry import Door
from proxy.exchange.flow import Flow
from proxy.exchange.headers import RawHeaders
from proxy.exchange.keys import ApiKeys
from proxy.exchange.metering import Meter
from proxy.exchange.metrics import Metrics
from proxy.exchange.quotas import Quotas
from proxy.exchange.readiness import Learning
from proxy.exchange.stored import ledger_for
from proxy.policy.guard import Guard
from proxy.policy.steps import Steps
from proxy.settings import RedisSettings, Settings
from proxy.upstream.client import Upstream
from proxy.upstream.discovery import discover
from proxy.upstream.headers import Credentials
from proxy.upstream.http import HttpClient
from proxy.upstream.remote_count import RemoteCounter
from proxy.upstream.transport import Transport

if TYPE_CHECKING:
    from proxy.fleet.link import RedisLink
    from proxy.fleet.presence import Presence

log = logging.getLogger("token_guard.app")
Job = Callable[[], Awaitable[None]]  # a piece of the background work, started when called


class Core:
    def __init__(
        self, settings: Settings, registry: ModelRegistry, transport: Transport | None = None,
        chunk_instead: str | None = None,
    ) -> None:  # fmt: skip
        """`transport`: the HTTP client toward the upstream; None: aiohttp's (upstream/http.py), as when serving.
        `chunk_instead`: for a front end that cannot fan a request out ("reject" or "truncate"), what the chunk
        policy becomes (policy/guard.py); None: chunking is available."""
        self.settings, self.registry = settings, registry
        self.link = _redis_link(settings.redis)
        server = settings.server
        self.keys = ApiKeys(server.api_keys, settings.keys, server.admin_api_keys, server.metrics_api_key)
        self.credentials = Credentials.of(settings.upstream.api_key, self.keys.any)  # the same for both front ends
        self.upstream = Upstream(
            settings.upstream, transport or HttpClient(settings.upstream), settings.admission,
            workers=server.workers, link=self.link, redis=settings.redis, credentials=self.credentials,
        )  # fmt: skip
        self.metrics = Metrics(
            lambda: {name: registry.resolve(name).counter.stats() for name in registry.names},
            lambda: (
                self.upstream.admission.queued,
                {str(i): r.budget.tokens for i, r in enumerate(self.upstream.replicas)},
            ),  # fmt: skip
        )
        self.presence: Presence | None = None  # this process's heartbeat in Redis: how many guards share it
        if self.link is not None:
            from proxy.exchange.fleet_metrics import FleetState
            from proxy.fleet.presence import Presence
            from proxy.upstream.fleet_gate import FleetAdmission

            gate = self.upstream.admission
            fleet_gate = gate if isinstance(gate, FleetAdmission) else None
            self.presence = fleet_gate.presence if fleet_gate else Presence(self.link, settings.redis.lease_s)
            self.metrics.register(FleetState(self.link, fleet_gate))
        self.ledger = ledger_for(settings, self.link)
        self.renderer, self.parser = IsolatedRenderer(), BodyParser()  # each child process spawned on first use
        registry.render_requests_in(self.renderer)
        remote = RemoteCounter(self.upstream)
        steps = Steps(settings, registry, remote, self.upstream.ceiling, chunk_instead, self.ledger)
        self.guard = Guard(steps, self.parser)
        self.evidence = Evidence(registry, remote)  # answers' usage against the guard's counts
        presence = self.presence
        self.quotas = Quotas(settings, self.link, (lambda: presence.alive) if presence is not None else None)
        self.meter = Meter(self.quotas)
        self.learning = Learning(server.ready_wait_s)
        self.upstream.returned = self.learning.stale  # a replica back from being out may have restarted
        self.flow = Flow(self.guard, self.meter, self.metrics, self.learning)
        self.render_only = settings.render.only  # `token-guard render`: no upstream is asked anything
        if self.render_only:
            self.routes = RouteTable(render_only(), templates=False)
        else:
            self.routes = RouteTable(passthrough=server.passthrough_paths)
        for route in self.routes.kept:
            log.warning("server.passthrough_paths: %s is a %s route of the table and stays one", route.path, route.kind)
        for path in self.routes.unguarded:
            log.warning("server.passthrough_paths opens %s unguarded: its requests are relayed without being counted, "
                        "clamped, admitted or charged", path)  # fmt: skip
        self.door = Door(self.routes, self.keys)
        self.drain = Drain()
        self.bodies = BodyBudget(server.max_held_body_bytes)
        self.followers = Followers(self.upstream, self.meter, self.drain, settings.admission, self.metrics)
        self._life: contextlib.AbstractAsyncContextManager[None] | None = None

    async def __aenter__(self) -> Core:
        """The background work started; each job is logged if it fails, never taking the front end down."""
        if self._life is not None:
            raise RuntimeError("a Core's lifetime is entered once")
        self._life = self._lifetime()
        await self._life.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> bool | None:
        assert self._life is not None, "a Core's lifetime is left only once entered"
        return await self._life.__aexit__(kind, error, trace)

    @contextlib.asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        try:
            async with asyncio.TaskGroup() as group:
                jobs = [group.create_task(job) for job in self._jobs()]
                try:
                    yield
                finally:
                    for job in jobs:
                        job.cancel()
        finally:
            await self._aclose()

    def sight(self, headers: RawHeaders) -> tuple[bool, bool]:
        """What the guard's own /health and /metrics show a request: (key names and per-key usage, model names). An
        operator's key (server.metrics_api_key or an admin key) sees both; anyone else sees the models only where any
        client may list them (no client keys configured), so that a key learns nothing of models it may not use."""
        operator = self.keys.operator(headers)
        return operator, operator or not self.keys

    async def readiness(self, models: bool = False) -> tuple[int, dict[str, object]]:
        """/health's answer: ready once the guard knows how the upstream counts (its models, windows, default model,
        server defaults, the start-up check's verdicts: readiness.py) and an upstream replica answers its own /health,
        until the guard is told to stop; the models' names only when `models` (Core.sight)."""
        if self.drain.stopping:
            return 503, {"status": "stopping", "detail": "token-guard is stopping: new requests go elsewhere"}
        # first: a replica back from being out makes it learn again
        healthy = self.render_only or await self.upstream.is_healthy()
        if not self.learning.known:
            learning = "the upstream's models" if self.registry.discovering else "how the upstream counts"
            detail = f"learning {learning}"
            return 503, {"status": "starting", "detail": detail}
        if not healthy:
            return 503, {"status": "unhealthy", "detail": "no upstream replica answers its /health"}
        # checked: the start-up check has run, so each model's count source is decided
        shown: dict[str, object] = {"models": self.registry.names} if models else {}
        if models and self.evidence.moved:  # answers' usage moved these models' counting to the upstream
            shown["counted_upstream"] = dict(self.evidence.moved)
        return 200, {"status": "ok", **shown, "checked": self.registry.checked}

    def exposition(self, headers: RawHeaders) -> bytes:
        """/metrics' answer, as much of it as the request may see (Core.sight)."""
        return self.metrics.exposition(*self.sight(headers))

    def _jobs(self) -> list[Coroutine[Any, Any, None]]:
        """The background work of the core's lifetime, each logged if it fails (never taking the server down). Each
        job's coroutine is made only once its task runs: a lifetime left at once cancels tasks that never began."""
        if self.render_only:
            return [_logged(partial(_render_ready, self.settings, self.registry, self.learning, self.routes))]
        learn = partial(_learn_models, self.settings, self.registry, self.upstream, self.learning, self.routes,
                        self.evidence)  # fmt: skip
        jobs: list[Job] = [learn, self.upstream.watch_health, self.followers.run]
        if self.upstream.auto_budget:
            jobs.append(self.upstream.learn_budgets)
        if self.link is not None and self.presence is not None:
            jobs += [self.link.watch, *(self.upstream.fleet_jobs() or [self.presence.run])]
        return [_logged(job) for job in jobs]

    async def _aclose(self) -> None:
        try:
            await self.upstream.aclose()
            if self.link is not None:
                await self.link.aclose()
        finally:
            await asyncio.to_thread(_close, self.renderer, self.parser)


def _close(*children: IsolatedRenderer | BodyParser) -> None:
    for child in children:
        child.close()


def _redis_link(redis: RedisSettings) -> RedisLink | None:
    """The one link to Redis, when guards share state through it (imported only then)."""
    if redis.url is None:
        return None
    from proxy.fleet.link import RedisLink

    return RedisLink(redis.url, redis.timeout_ms)


async def _learn_models(
    settings: Settings, registry: ModelRegistry, upstream: Upstream, learning: Learning, routes: RouteTable,
    evidence: Evidence,
) -> None:  # fmt: skip
    """Discovery until it succeeds, then the start-up check (warnings, counting.source auto's verdicts, the
    upstream's release and so the Messages API's error vocabulary on `routes`): then the guard counts. Again,
    the same way, whenever a replica comes back from being out (it may have restarted with another template, other
    defaults or another release), the answers' evidence forgotten; meanwhile nothing is counted."""
    while True:
        registry.apply_discovery(await _discovered(settings, upstream))
        for line in await drift_warnings(registry, upstream, evidence.counter):
            log.warning("%s", line)
        routes.speak(registry.anthropic_error_types())
        learning.learned()
        await learning.until_stale()
        registry.forget_learned()
        evidence.forget()
        log.info("an upstream replica is back: learning its models and how it counts again before counting")


async def _render_ready(settings: Settings, registry: ModelRegistry, learning: Learning, routes: RouteTable) -> None:
    """`token-guard render`: the configured models are all it renders, by the rules of render.vllm_version (the
    newest the guard knows when unset); ready at once."""
    if settings.render.vllm_version is not None:
        registry.set_upstream_version(settings.render.vllm_version)
    routes.speak(registry.anthropic_error_types())
    learning.learned()


async def _discovered(settings: Settings, upstream: Upstream) -> list[ModelCard]:
    """The upstream's model cards, asked until it answers."""
    while True:
        try:
            return await discover(upstream, settings.upstream.startup_wait_s)
        except GuardError as exc:
            log.error("%s; still retrying", exc.message)


async def _logged(job: Job) -> None:
    """A background job whose unexpected failure is logged, and does not take the server down with it."""
    try:
        await job()
    except Exception:
        log.exception("a background task failed; the guard keeps serving without it")

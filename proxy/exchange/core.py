"""What every front end serves requests with, built once from the settings: the upstream (model discovery, health, KV
budgets, admission), the guard, the quotas, the metrics, the keys, the route table, the bytes of request bodies held
at once and the drain; and the background work of its lifetime (learning the upstream's models, watching replicas'
health, reading KV budgets, the Redis link)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from proxy.api.routes import RouteTable
from proxy.counting.registry import ModelRegistry
from proxy.doctor.run import drift_warnings
from proxy.errors import GuardError
from proxy.exchange.bodies import BodyBudget
from proxy.exchange.drain import Drain
from proxy.exchange.entry import Door
from proxy.exchange.flow import Flow
from proxy.exchange.keys import ApiKeys
from proxy.exchange.metering import Meter
from proxy.exchange.metrics import Metrics
from proxy.exchange.quotas import Quotas
from proxy.policy.guard import Guard
from proxy.settings import RedisSettings, Settings
from proxy.upstream.client import Upstream
from proxy.upstream.discovery import discover
from proxy.upstream.http import HttpClient
from proxy.upstream.remote_count import RemoteCounter
from proxy.upstream.transport import Transport

if TYPE_CHECKING:
    from proxy.fleet.link import RedisLink

log = logging.getLogger("token_guard.app")


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
        self.upstream = Upstream(
            settings.upstream, transport or HttpClient(settings.upstream), settings.admission,
            workers=settings.server.workers, link=self.link, redis=settings.redis,
        )  # fmt: skip
        self.metrics = Metrics(
            lambda: {name: registry.resolve(name).counter.stats() for name in registry.names},
            lambda: (
                self.upstream.admission.queued,
                {str(i): r.budget.tokens for i, r in enumerate(self.upstream.replicas)},
            ),  # fmt: skip
        )
        if self.link is not None:
            from proxy.exchange.fleet_metrics import FleetState
            from proxy.upstream.fleet_gate import FleetAdmission

            gate = self.upstream.admission
            self.metrics.register(FleetState(self.link, gate if isinstance(gate, FleetAdmission) else None))
        self.guard = Guard(settings, registry, RemoteCounter(self.upstream), self.upstream.ceiling, chunk_instead)
        self.quotas = Quotas(settings, self.link)
        self.meter = Meter(self.quotas)
        self.flow = Flow(self.guard, self.meter, self.metrics)
        server = settings.server
        self.routes = RouteTable(passthrough=server.passthrough_paths)
        for route in self.routes.kept:
            log.warning("server.passthrough_paths: %s is a %s route of the table and stays one", route.path, route.kind)
        for path in self.routes.unguarded:
            log.warning("server.passthrough_paths opens %s unguarded: its requests are relayed without being counted, "
                        "clamped, admitted or charged", path)  # fmt: skip
        self.keys = ApiKeys(server.api_keys, settings.keys, server.admin_api_keys, server.metrics_api_key)
        self.door = Door(self.routes, self.keys)
        self.drain = Drain()
        self.bodies = BodyBudget(server.max_held_body_bytes)

    async def readiness(self) -> tuple[int, dict[str, object]]:
        """/health's answer: ready once the models are known and an upstream replica answers its own /health, until
        the guard is told to stop."""
        if self.drain.stopping:
            return 503, {"status": "stopping", "detail": "token-guard is stopping: new requests go elsewhere"}
        if self.registry.discovering:
            return 503, {"status": "starting", "detail": "learning the upstream's models"}
        if not await self.upstream.is_healthy():
            return 503, {"status": "unhealthy", "detail": "no upstream replica answers its /health"}
        # checked: the start-up check has run, so each model's count source is decided
        return 200, {"status": "ok", "models": self.registry.names, "checked": self.registry.checked}

    def jobs(self) -> list[Coroutine[Any, Any, None]]:
        """The background work of the front end's lifetime, each logged if it fails (never taking the server down)."""
        jobs = [_learn_models(self.settings, self.registry, self.upstream), self.upstream.watch_health()]
        if self.upstream.auto_budget:
            jobs.append(self.upstream.learn_budgets())
        if self.link is not None:
            jobs += [self.link.watch(), *(self.upstream.fleet_jobs() or [_heartbeat(self.link, self.settings)])]
        return [_logged(job) for job in jobs]

    async def aclose(self) -> None:
        await self.upstream.aclose()
        if self.link is not None:
            await self.link.aclose()


def _redis_link(redis: RedisSettings) -> RedisLink | None:
    """The one link to Redis, when guards share state through it (imported only then)."""
    if redis.url is None:
        return None
    from proxy.fleet.link import RedisLink

    return RedisLink(redis.url, redis.timeout_ms)


async def _heartbeat(link: RedisLink, settings: Settings) -> None:
    """This instance's heartbeat in Redis when no fleet budget keeps one (`token-guard doctor` counts them)."""
    from proxy.fleet.presence import Presence

    await Presence(link, settings.redis.lease_s).run()


async def _learn_models(settings: Settings, registry: ModelRegistry, upstream: Upstream) -> None:
    """Discovery until it succeeds, then the start-up drift check (warnings only)."""
    while True:
        try:
            cards = await discover(upstream, settings.upstream.startup_wait_s)
        except GuardError as exc:
            log.error("%s; still retrying", exc.message)
            continue
        registry.apply_discovery(cards)
        break
    for line in await drift_warnings(settings, registry, upstream):
        log.warning("%s", line)


async def _logged(job: Awaitable[None]) -> None:
    """A background job whose unexpected failure is logged, and does not take the server down with it."""
    try:
        await job
    except Exception:
        log.exception("a background task failed; the guard keeps serving without it")

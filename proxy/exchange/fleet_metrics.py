"""Metrics of the fleet's state in Redis (redis.url), read when scraped: whether this instance
reaches Redis, its failed calls, how many guards share the Redis, each replica's tokens in flight across them, the
requests this instance admitted on its credit (no round trip), and those it admitted on its own share, or refused,
while Redis was away. A replica is labelled by its place in upstream.urls, as in token_guard_inflight_tokens, not by
its address (which is what Redis keys it by)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from proxy.fleet.link import RedisLink
    from proxy.upstream.fleet_gate import FleetAdmission


class FleetState(Collector):
    def __init__(self, link: RedisLink, gate: FleetAdmission | None) -> None:
        self.link, self.gate = link, gate

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("token_guard_redis_up", "1 while this instance reaches Redis (redis.url)")
        up.add_metric([], 1 if self.link.healthy else 0)
        errors = CounterMetricFamily("token_guard_redis_errors", "Redis calls that failed or timed out")
        errors.add_metric([], self.link.errors)
        families: list[Metric] = [up, errors]
        if self.gate is not None:
            families += self._gate(self.gate)
        return families

    def _gate(self, gate: FleetAdmission) -> list[Metric]:
        alive = GaugeMetricFamily("token_guard_redis_instances", "Guard processes sharing the Redis (heartbeats)")
        alive.add_metric([], gate.presence.alive)
        tokens = GaugeMetricFamily(
            "token_guard_shared_inflight_tokens", "KV tokens in flight across guards, as last seen", labels=["replica"]
        )
        for index, url in enumerate(gate.urls):
            if url in gate.fleet_tokens:
                tokens.add_metric([str(index)], gate.fleet_tokens[url])
        local = CounterMetricFamily(
            "token_guard_admission_local_fallbacks", "Requests admitted on this process's share while Redis was away"
        )
        local.add_metric([], gate.fallbacks)
        refused = CounterMetricFamily(
            "token_guard_admission_redis_refusals", "Requests answered 503 while Redis was away (redis.failure closed)"
        )
        refused.add_metric([], gate.refusals)
        credit = CounterMetricFamily(
            "token_guard_admission_credit", "Requests admitted on this process's credit, without a Redis round trip"
        )
        credit.add_metric([], gate.credit.admitted)
        return [alive, tokens, local, refused, credit]

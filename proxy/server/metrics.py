"""Prometheus metrics for one app instance (its own registry: nothing global), fed by finished request records."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.counting.counter import CounterStats
from proxy.policy.outcome import Decision
from proxy.server.record import RequestRecord

TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COUNT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
CHUNK_BUCKETS = (2, 3, 4, 6, 8, 12, 16, 32, 64, 128)

ME = ("model", "endpoint")


DEFINITIONS: list[tuple[str, type, str, str, tuple[str, ...], tuple[float, ...] | None]] = [
    ("requests", Counter, "token_guard_requests", "Guarded requests by action and status", (*ME, "action", "status"),
     None),
    ("prompt_tokens", Histogram, "token_guard_prompt_tokens", "Prompt tokens of guarded requests", ME, TOKEN_BUCKETS),
    ("output_asked", Counter, "token_guard_output_tokens_requested",
     "Output tokens the clients asked for (max_tokens / max_completion_tokens)", ME, None),
    ("clamped", Counter, "token_guard_clamped_tokens", "Output tokens removed from requests by the clamp", ME, None),
    ("rejections", Counter, "token_guard_overflow_rejections", "Requests refused because the prompt cannot fit", ME,
     None),
    ("truncated", Counter, "token_guard_truncated_tokens", "Prompt tokens cut by the truncate policy", ME, None),
    ("chunks", Histogram, "token_guard_chunks", "Parts per chunked request", ME, CHUNK_BUCKETS),
    ("fanout", Gauge, "token_guard_fanout_parts_in_flight", "Parts of chunked requests running now", (), None),
    ("first_byte", Histogram, "token_guard_upstream_first_byte_seconds", "Upstream time to response headers", ME,
     LATENCY_BUCKETS),
    ("upstream_total", Histogram, "token_guard_upstream_seconds", "Upstream time to the last byte", ME,
     LATENCY_BUCKETS),
    ("upstream_errors", Counter, "token_guard_upstream_errors", "Upstream failures by kind", ("kind",), None),
    ("count_time", Histogram, "token_guard_tokenize_seconds", "Time to count a request's prompt tokens", ("model",),
     COUNT_BUCKETS),
    ("disconnects", Counter, "token_guard_client_disconnects", "Clients that went away before their answer ended",
     ("endpoint",), None),
    ("queue_wait", Histogram, "token_guard_admission_wait_seconds", "Time requests waited for admission", ME,
     LATENCY_BUCKETS),
]  # fmt: skip


class Metrics:
    def __init__(
        self, counters: Callable[[], dict[str, CounterStats]], gate: Callable[[], tuple[int, dict[str, int]]]
    ) -> None:
        self.registry = CollectorRegistry()
        for attr, kind, name, help_text, labels, buckets in DEFINITIONS:
            options: dict[str, Any] = {"registry": self.registry}
            if buckets is not None:
                options["buckets"] = buckets
            setattr(self, attr, kind(name, help_text, labels, **options))
        self.registry.register(_CounterCaches(counters))
        self.registry.register(_Gate(gate))

    requests: Counter
    prompt_tokens: Histogram
    output_asked: Counter
    clamped: Counter
    rejections: Counter
    truncated: Counter
    chunks: Histogram
    fanout: Gauge
    first_byte: Histogram
    upstream_total: Histogram
    upstream_errors: Counter
    count_time: Histogram
    disconnects: Counter
    queue_wait: Histogram

    def observe(self, record: RequestRecord) -> None:
        found, decision = record.findings, record.findings.decision
        labels = (found.model or "", record.endpoint)
        if record.guarded:
            self.requests.labels(*labels, decision.action if decision else "error", str(record.status)).inc()
            if found.count_s is not None:
                self.count_time.labels(found.model or "").observe(found.count_s)
            if found.max_tokens_before is not None:
                self.output_asked.labels(*labels).inc(found.max_tokens_before)
            if decision is not None:
                self._decided(labels, decision, found.max_tokens_before)
        if record.upstream_first_byte_s is not None:
            self.first_byte.labels(*labels).observe(record.upstream_first_byte_s)
        if record.upstream_s is not None:
            self.upstream_total.labels(*labels).observe(record.upstream_s)
        if record.upstream_error:
            self.upstream_errors.labels(record.upstream_error).inc()
        if record.client_gone:
            self.disconnects.labels(record.endpoint).inc()
        if record.queue_s is not None:
            self.queue_wait.labels(*labels).observe(record.queue_s)

    def _decided(self, labels: tuple[str, str], decision: Decision, asked: int | None) -> None:
        self.prompt_tokens.labels(*labels).observe(decision.prompt_tokens)
        if asked is not None and decision.max_tokens is not None and decision.max_tokens < asked:
            self.clamped.labels(*labels).inc(asked - decision.max_tokens)
        if decision.action == "reject":
            self.rejections.labels(*labels).inc()
        if decision.truncated_tokens:
            self.truncated.labels(*labels).inc(decision.truncated_tokens)
        if decision.chunks:
            self.chunks.labels(*labels).observe(decision.chunks)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _CounterCaches(Collector):
    """The segment caches' own counters, read when scraped."""

    def __init__(self, counters: Callable[[], dict[str, CounterStats]]) -> None:
        self.counters = counters

    def collect(self) -> Iterable[Metric]:
        stats = self.counters()
        model = ["model"]
        hits = CounterMetricFamily(
            "token_guard_count_cache_hits", "Prompt segments found in the count cache", labels=model
        )
        misses = CounterMetricFamily("token_guard_count_cache_misses", "Prompt segments encoded anew", labels=model)
        size = GaugeMetricFamily("token_guard_count_cache_bytes", "Memory held by the count cache", labels=model)
        for name, s in stats.items():
            hits.add_metric([name], s.hits)
            misses.add_metric([name], s.misses)
            size.add_metric([name], s.bytes)
        return [hits, misses, size]


class _Gate(Collector):
    """The admission gate's state, read when scraped: requests queued, and tokens in flight per replica."""

    def __init__(self, gate: Callable[[], tuple[int, dict[str, int]]]) -> None:
        self.gate = gate

    def collect(self) -> Iterable[Metric]:
        queued, inflight = self.gate()
        depth = GaugeMetricFamily("token_guard_admission_queue_depth", "Requests waiting for admission")
        depth.add_metric([], queued)
        tokens = GaugeMetricFamily("token_guard_inflight_tokens", "KV tokens admitted and running", labels=["replica"])
        for replica, value in inflight.items():
            tokens.add_metric([replica], value)
        return [depth, tokens]

"""Prometheus metrics for one app instance, fed by finished request records.

The hot path only adds to plain numbers in dicts (no locks, no metric objects per request); the Prometheus families
are built from them when /metrics is scraped. Each instance has its own registries: nothing global.

What a scrape shows depends on who asks (exchange/core.py `Core.sight`): key names and per-key usage only to an
operator's key; model names only to an operator's key, or to anyone where any client may list the models (no client
keys configured). A scrape that may not see them gets the same families summed over the models, without the `model`
label: a client learns no model a key of its own may not use. A replica is its place in upstream.urls, never its
address.
"""

from __future__ import annotations

import bisect
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.counting.text_count import CounterStats
from proxy.exchange.record import RequestRecord, thinking_budget
from proxy.policy.decide import Action
from proxy.policy.outcome import Decision

TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COUNT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
CHUNK_BUCKETS = (2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
MISMATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)
CANCEL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

ME = ("model", "endpoint")
Labels = tuple[str, ...]


@dataclass(frozen=True)
class Definition:
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] | None = None  # a histogram when set, else a counter


DEFINITIONS = {
    "requests": Definition("token_guard_requests", "Guarded requests by action and status", (*ME, "action", "status")),
    "prompt_tokens": Definition("token_guard_prompt_tokens", "Prompt tokens of guarded requests", ME, TOKEN_BUCKETS),
    "output_asked": Definition(
        "token_guard_output_tokens_requested",
        "Output tokens the clients asked for (max_tokens / max_completion_tokens)",
        ME,
    ),
    "clamped": Definition("token_guard_clamped_tokens", "Output tokens removed from requests by the clamp", ME),
    "rejections": Definition("token_guard_overflow_rejections", "Requests refused because the prompt cannot fit", ME),
    "truncated": Definition("token_guard_truncated_tokens", "Prompt tokens cut by the truncate policy", ME),
    "chunks": Definition("token_guard_chunks", "Parts per chunked request", ME, CHUNK_BUCKETS),
    "dropped": Definition("token_guard_dropped_messages", "Messages (or turns) the truncate policy dropped", ME),
    "next_turn": Definition(
        "token_guard_next_turn_tokens", "Tokens of the window a clamp kept free for the conversation's next turn", ME
    ),
    "thinking": Definition(
        "token_guard_thinking_changes",
        "Anthropic thinking budgets lowered with the output limit (lowered), or thinking turned off (disabled)",
        (*ME, "change"),
    ),
    "merges": Definition(
        "token_guard_chunk_merges",
        "Chunked requests' answers merged by a combining request (reduce), or joined when it would not fit (concat)",
        (*ME, "merge"),
    ),
    "first_byte": Definition(
        "token_guard_upstream_first_byte_seconds", "Upstream time to response headers", ME, LATENCY_BUCKETS
    ),
    "upstream_total": Definition("token_guard_upstream_seconds", "Upstream time to the last byte", ME, LATENCY_BUCKETS),
    "upstream_errors": Definition("token_guard_upstream_errors", "Upstream failures by kind", ("kind",)),
    "count_time": Definition(
        "token_guard_tokenize_seconds", "Time to count a request's prompt tokens", ("model",), COUNT_BUCKETS
    ),
    "count_source": Definition(
        "token_guard_count_source", "Guarded requests by who counted the prompt (local or upstream)", (*ME, "source")
    ),
    "disconnects": Definition(
        "token_guard_client_disconnects", "Clients that went away before their answer ended", ("endpoint",)
    ),
    "cancel": Definition(
        "token_guard_cancel_seconds",
        "From a client's connection closing to the guard having given up its work: upstream request closed (which "
        "makes vLLM abort), chunks cancelled, or place in the admission queue left",
        ("endpoint",),
        CANCEL_BUCKETS,
    ),
    "key_tokens": Definition(
        "token_guard_key_tokens_charged", "Tokens charged to each named API key, after what went unused", ("key",)
    ),
    "key_limited": Definition(
        "token_guard_key_requests_limited", "Requests refused because their API key was over quota", ("key",)
    ),
    "count_checks": Definition(
        "token_guard_count_checks", "Answers whose usage was compared with the guard's count of the prompt",
        ("model", "source"),
    ),
    "count_mismatches": Definition(
        "token_guard_count_mismatches", "Answers whose usage disagreed with the guard's count of the prompt",
        ("model", "source"),
    ),
    "mismatch_tokens": Definition(
        "token_guard_count_mismatch_tokens", "How far the guard's count of a prompt was from what vLLM charged",
        ("model", "source"), MISMATCH_BUCKETS,
    ),
    "queue_wait": Definition(
        "token_guard_admission_wait_seconds", "Time requests waited for admission", ME, LATENCY_BUCKETS
    ),
}  # fmt: skip


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        running, out = 0, list[tuple[str, float]]()
        for bound, count in zip([*map(str, map(float, self.buckets)), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out


class InFlight:
    """A gauge of chunked requests' chunks running now."""

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1


class Metrics:
    def __init__(
        self, counters: Callable[[], dict[str, CounterStats]], gate: Callable[[], tuple[int, dict[str, int]]]
    ) -> None:
        self._counters: defaultdict[tuple[str, tuple[str, ...]], float] = defaultdict(float)
        self._histograms: dict[tuple[str, tuple[str, ...]], _Histogram] = {}
        self.fanout = InFlight()
        # (key names and usage, model names) -> what a scrape that may see them gets
        self.registries = {sight: CollectorRegistry() for sight in ((True, True), (False, True), (False, False))}
        for (keys, models), registry in self.registries.items():
            registry.register(_Families(self, keys, models))
            registry.register(_CounterCaches(counters, models))
            registry.register(_Gate(gate))

    def add(self, metric: str, labels: tuple[str, ...], value: float = 1) -> None:
        self._counters[metric, labels] += value

    def observe_value(self, metric: str, labels: tuple[str, ...], value: float) -> None:
        histogram = self._histograms.get((metric, labels))
        if histogram is None:
            histogram = self._histograms[metric, labels] = _Histogram(DEFINITIONS[metric].buckets or ())
        histogram.observe(value)

    def observe(self, record: RequestRecord) -> None:
        found, decision = record.findings, record.findings.decision
        labels = (found.model or "", record.endpoint)
        if record.guarded:
            self.add("requests", (*labels, decision.action if decision else "error", str(record.status)))
            if found.count_s is not None:
                self.observe_value("count_time", (found.model or "",), found.count_s)
            if found.count_source is not None:
                self.add("count_source", (*labels, found.count_source))
            if found.max_tokens_before is not None:
                self.add("output_asked", labels, found.max_tokens_before)
            if decision is not None:
                self._decided(labels, decision, found.max_tokens_before)
            if record.usage_prompt_tokens is not None and found.expected is not None:
                self._checked((found.model or "", found.count_source or ""), found.expected, record.usage_prompt_tokens)
            if record.merge is not None:
                self.add("merges", (*labels, record.merge))
        if record.upstream_first_byte_s is not None:
            self.observe_value("first_byte", labels, record.upstream_first_byte_s)
        if record.upstream_s is not None:
            self.observe_value("upstream_total", labels, record.upstream_s)
        if record.upstream_error:
            self.add("upstream_errors", (record.upstream_error,))
        if record.client_gone:
            self.add("disconnects", (record.endpoint,))
        if record.cancel_s is not None:
            self.observe_value("cancel", (record.endpoint,), record.cancel_s)
        if record.queue_s is not None:
            self.observe_value("queue_wait", labels, record.queue_s)
        if found.api_key is not None:
            if record.charged_tokens:
                self.add("key_tokens", (found.api_key.name,), record.charged_tokens)
            if record.quota_limited:
                self.add("key_limited", (found.api_key.name,))

    def _checked(self, labels: tuple[str, str], counted: int, charged: int) -> None:
        self.add("count_checks", labels)
        if counted != charged:
            self.add("count_mismatches", labels)
            self.observe_value("mismatch_tokens", labels, abs(charged - counted))

    def charged(self, record: RequestRecord) -> None:
        """A charge settled after its request's record was observed (a background response's, once it ended)."""
        key = record.findings.api_key
        if key is not None and record.charged_tokens:
            self.add("key_tokens", (key.name,), record.charged_tokens)

    def _decided(self, labels: tuple[str, str], decision: Decision, asked: int | None) -> None:
        if decision.action != Action.UNCOUNTED:
            self.observe_value("prompt_tokens", labels, decision.prompt_tokens)
        if asked is not None and decision.max_tokens is not None and decision.max_tokens < asked:
            self.add("clamped", labels, asked - decision.max_tokens)
        if decision.action == Action.REJECT:
            self.add("rejections", labels)
        if decision.truncated_tokens:
            self.add("truncated", labels, decision.truncated_tokens)
        if decision.chunks:
            self.observe_value("chunks", labels, decision.chunks)
        if decision.dropped_messages:
            self.add("dropped", labels, decision.dropped_messages)
        if decision.next_turn:
            self.add("next_turn", labels, decision.next_turn)
        if decision.thinking is not None:
            self.add("thinking", (*labels, "disabled" if thinking_budget(decision.thinking) is None else "lowered"))

    def register(self, collector: Collector) -> None:
        """A collector of metrics that name no key and no model, for every exposition."""
        for registry in self.registries.values():
            registry.register(collector)

    def exposition(self, keys: bool = True, models: bool = True) -> bytes:
        """The Prometheus text; `keys`: with key names and per-key usage; `models`: with the model label (never keys
        without models)."""
        return generate_latest(self.registries[keys and models, models])

    def families(self, keys: bool = True, models: bool = True) -> Iterable[Metric]:
        for metric, definition in DEFINITIONS.items():
            if not keys and "key" in definition.labels:
                continue
            shown = definition.labels if models else tuple(label for label in definition.labels if label != "model")
            keep = [i for i, label in enumerate(definition.labels) if label in shown]
            if definition.buckets is None:
                counter = CounterMetricFamily(definition.name, definition.help, labels=shown)
                for labels, value in _summed(self._counters, metric, keep).items():
                    counter.add_metric(list(labels), value)
                yield counter
            else:
                family = HistogramMetricFamily(definition.name, definition.help, labels=shown)
                for labels, histogram in _merged(self._histograms, metric, keep, definition.buckets).items():
                    family.add_metric(list(labels), histogram.cumulative(), histogram.total)
                yield family
        # The name says parts, the chunks' old name: kept, so that dashboards still find it.
        chunks = GaugeMetricFamily("token_guard_fanout_parts_in_flight", "Chunks of chunked requests running now")
        chunks.add_metric([], self.fanout.value)
        yield chunks
        blocks = GaugeMetricFamily(
            "token_guard_python_allocated_blocks",
            "Memory blocks Python's allocator holds now: a leak grows it, the allocator keeping freed pages does not",
        )
        blocks.add_metric([], sys.getallocatedblocks())
        yield blocks


def _summed(counters: dict[tuple[str, tuple[str, ...]], float], metric: str, keep: list[int]) -> dict[Labels, float]:
    """A counter's values by the labels kept (those dropped summed over)."""
    summed: defaultdict[Labels, float] = defaultdict(float)
    for (name, labels), value in list(counters.items()):
        if name == metric:
            summed[tuple(labels[i] for i in keep)] += value
    return summed


def _merged(
    histograms: dict[tuple[str, tuple[str, ...]], _Histogram], metric: str, keep: list[int], buckets: tuple[float, ...]
) -> dict[Labels, _Histogram]:
    """A histogram's by the labels kept (those dropped merged: their counts and totals added)."""
    merged: dict[Labels, _Histogram] = {}
    for (name, labels), histogram in list(histograms.items()):
        if name != metric or not histogram.counts:
            continue
        kept = tuple(labels[i] for i in keep)
        into = merged.get(kept)
        if into is None:
            into = merged[kept] = _Histogram(buckets, [0] * len(histogram.counts))
        into.counts = [a + b for a, b in zip(into.counts, histogram.counts, strict=True)]
        into.total += histogram.total
    return merged


class _Families(Collector):
    def __init__(self, metrics: Metrics, keys: bool, models: bool) -> None:
        self.metrics, self.keys, self.models = metrics, keys, models

    def collect(self) -> Iterable[Metric]:
        return list(self.metrics.families(self.keys, self.models))


class _CounterCaches(Collector):
    """The counters' own numbers, read when scraped: segment caches, and fallbacks from upstream counting; summed
    over the models where the scrape may not see them."""

    def __init__(self, counters: Callable[[], dict[str, CounterStats]], models: bool = True) -> None:
        self.counters, self.models = counters, models

    def collect(self) -> Iterable[Metric]:
        stats = self.counters()
        if not self.models:
            stats = {"": _total(list(stats.values()))} if stats else {}
        model = ["model"] if self.models else []
        hits = CounterMetricFamily(
            "token_guard_count_cache_hits", "Prompt segments found in the count cache", labels=model
        )
        misses = CounterMetricFamily("token_guard_count_cache_misses", "Prompt segments encoded anew", labels=model)
        size = GaugeMetricFamily("token_guard_count_cache_bytes", "Memory held by the count cache", labels=model)
        fallbacks = CounterMetricFamily(
            "token_guard_upstream_count_fallbacks",
            "Prompts counted locally because the upstream's counting endpoint refused or failed them (a warning: "
            "counting.source upstream or auto)",
            labels=model,
        )
        for name, s in stats.items():
            shown = [name] if self.models else []
            hits.add_metric(shown, s.hits)
            misses.add_metric(shown, s.misses)
            size.add_metric(shown, s.bytes)
            fallbacks.add_metric(shown, s.fallbacks)
        return [hits, misses, size, fallbacks]


def _total(stats: list[CounterStats]) -> CounterStats:
    return CounterStats(*(sum(getattr(s, f.name) for s in stats) for f in fields(CounterStats)))


class _Gate(Collector):
    """The admission gate's state, read when scraped: requests queued, and tokens in flight per replica. A replica is
    labelled by its place in upstream.urls, never by its address: whoever reads /metrics learns nothing of where the
    upstream listens."""

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

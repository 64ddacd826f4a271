"""What a scrape shows by who asks: the same families summed over the models for one that may not see them, the
models for one that may, key names and usage only with them."""

from __future__ import annotations

from proxy.counting.text_count import CounterStats
from proxy.exchange.metrics import Metrics
from proxy.exchange.record import RequestRecord
from proxy.policy.outcome import Decision
from proxy.settings.sections import KeySettings
from tests.support.prometheus import metric

KEY = KeySettings("alice", "0" * 64, tokens_per_minute=1000)


def served(metrics: Metrics, model: str, prompt: int, charged: int) -> None:
    record = RequestRecord("r", "POST", "/v1/chat/completions", guarded=True)
    record.findings.model, record.findings.api_key = model, KEY
    record.findings.decision = Decision("pass", prompt)
    record.findings.count_s, record.upstream_first_byte_s = 0.002, 0.3
    record.charged_tokens = charged
    record.finish(200)
    metrics.observe(record)


def made() -> Metrics:
    stats = {"tiny": CounterStats(5, 2, 1, 100, 1000), "other": CounterStats(1, 1, 1, 50, 1000, fallbacks=1)}
    metrics = Metrics(lambda: stats, lambda: (0, {"0": 10}))
    served(metrics, "tiny", 20, 30)
    served(metrics, "tiny", 3000, 40)
    served(metrics, "other", 100, 50)
    return metrics


def test_without_the_models_the_families_are_their_sums() -> None:
    text = made().exposition(keys=False, models=False).decode()
    assert "model=" not in text and "tiny" not in text and "other" not in text and "alice" not in text
    assert metric(text, "token_guard_requests_total", endpoint="/v1/chat/completions", status="200") == 3
    assert metric(text, "token_guard_prompt_tokens_count", endpoint="/v1/chat/completions") == 3
    assert metric(text, "token_guard_prompt_tokens_sum", endpoint="/v1/chat/completions") == 3120
    assert metric(text, "token_guard_prompt_tokens_bucket", endpoint="/v1/chat/completions", le="256.0") == 2
    assert metric(text, "token_guard_tokenize_seconds_count") == 3
    assert metric(text, "token_guard_count_cache_hits_total") == 6
    assert metric(text, "token_guard_upstream_count_fallbacks_total") == 1
    assert metric(text, "token_guard_inflight_tokens", replica="0") == 10


def test_with_the_models_each_has_its_own_and_keys_only_with_them() -> None:
    metrics = made()
    models = metrics.exposition(keys=False, models=True).decode()
    assert metric(models, "token_guard_requests_total", model="tiny") == 2
    assert metric(models, "token_guard_prompt_tokens_count", model="other") == 1
    assert metric(models, "token_guard_count_cache_hits_total", model="tiny") == 5 and "alice" not in models
    full = metrics.exposition(keys=True, models=True).decode()
    assert metric(full, "token_guard_key_tokens_charged_total", key="alice") == 120
    assert "alice" not in metrics.exposition(keys=True, models=False).decode()  # keys never without models

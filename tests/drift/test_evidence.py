"""What an answer whose usage disagrees with the guard's count does: a warning at most once a minute per model (the
rest counted into the next), and in counting.source auto a move to upstream counting for a model the guard counted
itself, once three of its last ten checked answers disagreed and at least half of them did; never for a model
configured "local", nor for one the upstream already counts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy.counting.registry import ModelRegistry
from proxy.drift.evidence import MOVE_AFTER, QUIET_S, WINDOW, Evidence, Sighting
from proxy.settings import UpstreamSettings, load_settings
from proxy.upstream.client import Upstream
from proxy.upstream.http import HttpClient
from proxy.upstream.remote_count import RemoteCounter
from tests.support.servers import MODEL


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def evidence(tokenizer: Path, source: str, tokenizes: bool | None = True) -> tuple[Evidence, ModelRegistry, Clock]:
    """`tokenizes`: what the start-up check learned of the upstream's POST /tokenize (None: not asked)."""
    flags = {"model.name": MODEL, "model.tokenizer": str(tokenizer), "counting.source": source}
    settings = load_settings(flags, environ={})
    registry = ModelRegistry.from_settings(settings.models, settings.counting)
    upstream_settings = UpstreamSettings(urls=("http://127.0.0.1:9",))
    clock = Clock()
    counter = RemoteCounter(Upstream(upstream_settings, HttpClient(upstream_settings)))
    counter.renders, counter.tokenizes = False, tokenizes
    return Evidence(registry, counter, clock), registry, clock


def seen(source: str = "local", counted: int = 7, charged: int = 26) -> Sighting:
    return Sighting(MODEL, source, "/v1/chat/completions", "req-1", counted, charged)


def disagree(watch: Evidence, times: int, source: str = "local") -> None:
    for _ in range(times):
        watch.weigh(seen(source=source))


def test_a_locally_counted_model_in_auto_moves_to_the_upstream(deepseek_dir: Path) -> None:
    watch, registry, _ = evidence(deepseek_dir, "auto")
    disagree(watch, MOVE_AFTER - 1)
    assert registry.resolve(MODEL).count_source == "auto" and not watch.moved  # not on one client's say
    disagree(watch, 1)
    assert registry.resolve(MODEL).count_source == "upstream"
    assert "vLLM charged 26 prompt tokens where the guard counted 7" in watch.moved[MODEL]
    watch.forget()  # a fresh start-up check decides again, on evidence gathered afresh
    assert not watch.moved
    registry.set_count_source(MODEL, "auto", "a fresh start-up check agreed")
    disagree(watch, MOVE_AFTER - 1)
    assert registry.resolve(MODEL).count_source == "auto"


def test_a_few_disagreements_among_many_agreeing_answers_move_nothing(deepseek_dir: Path) -> None:
    """A shape the guard counts differently, sent now and then among answers that agree: warned and counted, but the
    model keeps its local counting until the disagreements are at least half of its last ten answers."""
    watch, registry, _ = evidence(deepseek_dir, "auto")
    for _ in range(3):
        for _ in range(WINDOW // 2 + 1):
            watch.agree(MODEL, "local")
        disagree(watch, WINDOW // 2 - 1)  # four of every ten
    assert registry.resolve(MODEL).count_source == "auto" and not watch.moved
    disagree(watch, 1)  # now five of the last ten
    assert registry.resolve(MODEL).count_source == "upstream"


@pytest.mark.parametrize("tokenizes", [False, None])
def test_an_upstream_not_known_to_count_takes_nothing(deepseek_dir: Path, tokenizes: bool | None) -> None:
    """An OpenAI-compatible server without POST /tokenize (or one never asked): local counting stays, since every
    request would otherwise fail over to it; the mismatch is still warned and counted."""
    watch, registry, _ = evidence(deepseek_dir, "auto", tokenizes)
    disagree(watch, MOVE_AFTER)
    assert registry.resolve(MODEL).count_source == "auto" and not watch.moved


@pytest.mark.parametrize("configured", ["local", "upstream"])
def test_a_model_configured_otherwise_stays(deepseek_dir: Path, configured: str) -> None:
    watch, registry, _ = evidence(deepseek_dir, configured)
    disagree(watch, MOVE_AFTER)
    assert registry.resolve(MODEL).count_source == configured and not watch.moved


def test_what_the_upstream_counted_moves_nothing(deepseek_dir: Path) -> None:
    watch, registry, _ = evidence(deepseek_dir, "auto")
    disagree(watch, MOVE_AFTER, source="upstream")
    assert registry.resolve(MODEL).count_source == "auto" and not watch.moved


def test_a_name_the_guard_serves_nothing_by_moves_nothing(deepseek_dir: Path) -> None:
    """Disagreements under a name no model is served by are warned, and weigh nothing: no window is kept for it, and
    the served model keeps its counting."""
    watch, registry, _ = evidence(deepseek_dir, "auto")
    for _ in range(WINDOW):
        watch.weigh(Sighting("made-up", "local", "/v1/chat/completions", "req-1", 7, 26))
    assert registry.resolve(MODEL).count_source == "auto" and not watch.moved


def test_warnings_are_rate_limited_per_model(deepseek_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    watch, _, clock = evidence(deepseek_dir, "local")
    with caplog.at_level(logging.WARNING, "token_guard.drift"):
        for _ in range(5):
            watch.weigh(seen())
            clock.now += 1
        clock.now += QUIET_S
        watch.weigh(seen(counted=8, charged=9))
    warnings = [r.getMessage() for r in caplog.records if r.name == "token_guard.drift"]
    assert len(warnings) == 2
    assert "counted 7" in warnings[0] and "/v1/chat/completions" in warnings[0] and "req-1" in warnings[0]
    assert "vLLM charged 9 prompt tokens where the guard counted 8" in warnings[1]
    assert "4 more since the last warning" in warnings[1]

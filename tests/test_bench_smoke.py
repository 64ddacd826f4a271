"""A smoke test of the benchmark harness: short load runs against the simulator on loopback, then the report's
aggregation and rendering on their records. No timing is asserted: this only proves the harness works."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from bench.aggregate import pool
from bench.load import LoadResult, LoadSpec, prompt_source, run_load
from bench.prompts import PromptCounter
from bench.render import report
from bench.scenarios import Run
from bench.targets import check
from tests.support.servers import MODEL, simulator


@pytest.fixture(scope="module")
def counter(deepseek_dir: Path) -> PromptCounter:
    return PromptCounter(deepseek_dir)


def load(url: str, counter: PromptCounter, **options: Any) -> LoadResult:
    spec = LoadSpec(url, MODEL, **options)
    return asyncio.run(run_load(spec, prompt_source(counter, spec.prompt_tokens, spec.turns)))


def test_closed_loop_streaming_and_conversations(deepseek_dir: Path, counter: PromptCounter) -> None:
    with simulator(deepseek_dir, max_model_len=4096, itl_s=0.001) as (server, _, _):
        plain = load(server.url, counter, duration_s=1.0, prompt_tokens=300, max_tokens=8, concurrency=2)
        streamed = load(
            server.url, counter, duration_s=1.0, prompt_tokens=120, max_tokens=12, concurrency=3, stream=True
        )
        talk = load(server.url, counter, duration_s=0.0, prompt_tokens=2000, max_tokens=4, concurrency=2, turns=3)
    for result, tokens in ((plain, 8), (streamed, 12)):
        summary = result.summary
        assert summary["requests"] > 0 and summary["ok"] == summary["requests"] and summary["errors"] == {}
        assert set(summary["total_ms"]) == {"p50", "p90", "p99", "mean"}
        assert summary["prompt_tokens"] == [result.spec.prompt_tokens]  # built to the exact count the server saw
        assert {r.output_tokens for r in result.records} == {tokens}
    assert all(r.ttft is not None and r.total is not None and r.ttft <= r.total for r in streamed.records)
    assert sorted(r.turn or 0 for r in talk.records) == [1, 1, 2, 2, 3, 3]  # one conversation per worker at duration 0
    sizes = sorted({r.prompt_tokens or 0 for r in talk.records})
    assert len(sizes) == 3 and sizes[-1] > 1000

    runs = [Run("c1", system, 1, plain.summary, 0.01, 100.0, plain.records) for system in ("direct", "token-guard")]
    pooled = pool(runs)
    text = report(pooled, machine(), settings(), check(pooled, {"token-guard": 150.0}, None), {}, None, [])
    assert "## non-stream, max_tokens 16, concurrency 1" in text and "| added total p50, ms |" in text


def test_open_loop(deepseek_dir: Path, counter: PromptCounter) -> None:
    with simulator(deepseek_dir) as (server, _, _):
        result = load(server.url, counter, duration_s=1.0, prompt_tokens=50, max_tokens=4, rate=20.0)
    assert result.summary["ok"] == len(result.records) > 3


def machine() -> dict[str, object]:
    return {
        "cores": 2,
        "cpu": "test",
        "memory_gb": 1,
        "kernel": "-",
        "python": "3",
        "load_average": (0.0, 0.0, 0.0),
        "token_guard_commit": "-",
        "packages": {},
    }


def settings() -> dict[str, object]:
    return {"date": "today", "rounds": 1, "duration_s": 1.0, "max_model_len": 4096, "cores": 2, "note": "test"}

"""`python -m bench load` as a newcomer types it: the OpenAI SDK's base URL (ending in /v1) works, and a run that can
only fail stops after its first failures with a message that says what to check, instead of running its duration."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from bench.load import GIVE_UP_AFTER, LoadResult, LoadSpec, add_arguments, main, prompt_source, run_load, server_root
from bench.prompts import PromptCounter
from tests.support.servers import MODEL, simulator


@pytest.fixture(scope="module")
def counter(deepseek_dir: Path) -> PromptCounter:
    return PromptCounter(deepseek_dir)


def load(url: str, counter: PromptCounter, model: str = MODEL, duration_s: float = 0.0) -> LoadResult:
    spec = LoadSpec(url, model, duration_s, prompt_tokens=40, max_tokens=2, concurrency=2)
    return asyncio.run(run_load(spec, prompt_source(counter, spec.prompt_tokens)))


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080"),
        ("http://gateway/llm/v1", "http://gateway/llm"),
    ],
)
def test_server_root_accepts_both_spellings(given: str, root: str) -> None:
    assert server_root(given) == root


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
def test_the_sdk_base_url_reaches_the_server(deepseek_dir: Path, counter: PromptCounter, suffix: str) -> None:
    with simulator(deepseek_dir) as (server, stats, _):
        result = load(server.url + suffix, counter)
        assert stats.snapshot()["completed"] == len(result.records) == 2
    assert result.gave_up is None
    assert result.records and all(r.status == 200 and r.error is None for r in result.records)


def test_a_run_where_every_request_fails_stops_early_and_says_why(deepseek_dir: Path, counter: PromptCounter) -> None:
    with simulator(deepseek_dir) as (server, _, _):
        # An hour-long run against a model the server does not have: it must stop after its first failures.
        result = load(server.url + "/v1", counter, model="no-such-model", duration_s=3600)
    assert GIVE_UP_AFTER <= len(result.records) < GIVE_UP_AFTER + 2  # at most one more was on its way back
    assert all(r.status == 404 for r in result.records)
    assert result.gave_up is not None
    assert f"first {len(result.records)} requests all failed (HTTP 404" in result.gave_up
    assert "does not exist" in result.gave_up  # the server's own reason
    assert f"POST {server.url}/v1/chat/completions" in result.gave_up
    assert "--base-url" in result.gave_up and "--model" in result.gave_up


def test_the_command_prints_why_and_exits_1(
    deepseek_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with simulator(deepseek_dir) as (server, _, _):
        args = parser.parse_args(
            ["--base-url", f"{server.url}/v1", "--model", "no-such-model", "--concurrency", "2", "--duration", "3600"]
            + ["--prompt-tokens", "40", "--tokenizer", str(deepseek_dir), "--out", str(tmp_path / "run.json")]
        )
        assert main(args) == 1
    err = capsys.readouterr().err
    assert "requests all failed (HTTP 404" in err and "check --base-url" in err
    assert '"gave_up": "stopped: the first' in (tmp_path / "run.json").read_text()

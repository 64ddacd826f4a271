"""`python -m bench tokens` without vLLM (`--systems guard,raw`): `token-guard render` and the raw encode given the
same chats, their token ids compared request by request, a mismatch failing the run; the guard's memory serving a model
per zoo tokenizer. Short sizes; no timing is asserted: this only proves the harness measures what it says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.token_texts import Texts

SHORT = ["--fresh", "2", "--fresh-tokens", "3000", "--conversations", "2", "--turns", "3", "--turn-tokens", "500",
         "--rounds", "1", "--concurrency", "4", "--small-tokens", "60", "--max-model-len", "8192"]  # fmt: skip


def run(out: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    code = main(["tokens", "--systems", "guard,raw", *SHORT, "--out", str(out), *extra])
    (result,) = out.glob("tokens-*.json")
    return code, json.loads(result.read_text()), result.with_suffix(".md").read_text()


def test_the_guards_token_ids_equal_the_raw_encodes_on_every_request(tmp_path: Path) -> None:
    code, result, text = run(tmp_path, "--families", "llama3.1,qwen3")
    assert code == 0 and result["mismatches"] == {"first": 0, "fresh": 0, "turn": 0, "small": 0}
    scenarios = result["scenarios"]
    for key, requests in {"first": 1, "fresh": 2, "turn": 2, "small": 4}.items():
        guard, raw = scenarios[key]["guard"], scenarios[key]["raw"]
        assert guard["requests"] == raw["requests"] == requests
        assert guard["tokens"] == raw["tokens"]  # the guard's answers counted, one per request
        assert guard["cpu_s"] > 0 and guard["tick_cpu_s"] >= 0 and raw["cpu_s"] >= 0
    assert all(3000 <= t <= 3010 for t in scenarios["fresh"]["guard"]["tokens"])  # the message and the template's
    assert all(1400 < t < 1450 for t in scenarios["turn"]["guard"]["tokens"])  # 3 asks of 400 tokens, 2 answers of 100
    models, one = result["rss_mb"]["guard-models"], result["rss_mb"]["guard"]
    assert models["models"] == ["llama3.1", "qwen3"] and models["all processes"] > one["all processes"] > 0
    assert "Token ids: 9 requests compared across guard,raw: 0 mismatches." in text
    assert "| fresh prompt (one user message, ~3,000 tokens), one at a time | 3,00" in text


def test_a_token_id_mismatch_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = Texts.rendered
    monkeypatch.setattr(Texts, "rendered", lambda self, chat: rendered(self, chat) + " more")  # raw encodes another
    code, result, text = run(tmp_path, "--families", "")
    assert code == 1 and result["mismatches"] == {"first": 1, "fresh": 2, "turn": 2, "small": 4}
    assert "9 mismatches" in text and "guard-models" not in result["rss_mb"]

"""Counts that check themselves: every answer's usage is compared with the guard's count of its prompt. A vLLM
restarted under a running guard with a chat template that adds a preamble, on the same port and between two health
checks (the guard never sees it go), charges more than the guard counts: the guard says so in /metrics and its log,
and in counting.source auto moves the model to upstream counting on the third disagreeing answer (not on one client's
say), whose counts are exact again at once. With nothing changed, every answer agrees."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import openai
import pytest

from proxy.server.running import ServerThread
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.ports import free_port
from tests.support.prometheus import metric
from tests.support.servers import MODEL, guard

CONVERSATIONS = [
    [{"role": "user", "content": "Tell me about rivers."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a sea."}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Go"}],
]
PREAMBLE = "This server was restarted with a template of its own, which says so in every prompt.\n"
QUIET = {"upstream.health_interval_s": 3600}  # the guard does not look at the replica between its requests


def with_preamble(tokenizer_dir: Path, into: Path) -> Path:
    """The tokenizer's own chat template, with a line in front of every prompt (vLLM's --chat-template)."""
    template = into / "preamble.jinja"
    template.write_text("{{ " + json.dumps(PREAMBLE) + " }}" + (tokenizer_dir / "chat_template.jinja").read_text())
    return template


def asked(client: openai.OpenAI, messages: list[dict[str, str]]) -> tuple[int, int, str]:
    """(the guard's count, what vLLM's usage charged, who counted) for one chat request."""
    answer = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=5)  # type: ignore[arg-type]
    usage = answer.parse().usage
    assert usage is not None
    return int(answer.headers["x-token-guard-prompt-tokens"]), usage.prompt_tokens, answer.headers[
        "x-token-guard-count-source"]  # fmt: skip


def scraped(url: str, name: str) -> float:
    return metric(httpx.get(f"{url}/metrics").text, name, model=MODEL, source="local")


def test_a_template_changed_under_a_running_guard_is_noticed_and_counted_right_again(
    deepseek_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    before = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL))
    template = with_preamble(deepseek_dir, tmp_path)
    after = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, chat_template=template))
    with ServerThread(before, port=port) as sim, guard(sim.url, deepseek_dir, **QUIET) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        for messages in CONVERSATIONS:
            counted, charged, source = asked(client, messages)
            assert counted == charged and source == "local"
        assert scraped(proxy.url, "token_guard_count_checks_total") == len(CONVERSATIONS)
        assert scraped(proxy.url, "token_guard_count_mismatches_total") == 0
        sim.stop()
        with ServerThread(after, port=port), caplog.at_level(logging.WARNING, "token_guard.drift"):
            seen = [asked(client, messages) for messages in CONVERSATIONS * 3]
            health = httpx.get(f"{proxy.url}/health").json()
            mismatches = scraped(proxy.url, "token_guard_count_mismatches_total")
            difference = scraped(proxy.url, "token_guard_count_mismatch_tokens_sum")
    wrong = [i for i, (counted, charged, _) in enumerate(seen) if counted != charged]
    assert wrong == [0, 1, 2]  # three of the last six answers disagree: every one after is counted right
    assert all(source == "upstream" for _, _, source in seen[3:])
    assert all(charged > counted for counted, charged, _ in seen[:3])
    counted, charged, _ = seen[2]  # the answer that moved the model
    assert mismatches == 3 and difference == sum(charged - counted for counted, charged, _ in seen[:3])
    assert f"vLLM charged {charged} prompt tokens" in health["counted_upstream"][MODEL]  # /health says why
    assert any(f"vLLM charged {charged} prompt tokens where the guard counted {counted}" in r.message
               for r in caplog.records)  # fmt: skip

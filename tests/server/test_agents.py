"""What agent clients send, through the guard to the simulator (vLLM 0.31's rules, with a reasoning parser so that a
thinking budget is served): Claude Code's thinking budget under a clamped max_tokens, a Responses second turn
(`previous_response_id`) and `truncation: "auto"` with a limit far over the window, and vLLM's own full queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.prometheus import metric
from tests.support.request_log import as_headers, changes_told, logged
from tests.support.servers import MODEL, InMemorySim, guard, simulator, simulator_in_memory

WINDOW = 2048
TOOL = {"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {
    "command": {"type": "string"}}, "required": ["command"]}}  # fmt: skip


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(
        deepseek_dir, profile="0.31", max_model_len=WINDOW, reasoning_parser="deepseek_r1"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path) -> Iterator[str]:
    """A clamp that gives all the room the prompt leaves (no share kept for the next turn): the thinking budget's
    rules at the edge of the window (tests/server/test_next_turn.py holds them with the share kept)."""
    shares = {f"policy.next_turn_share_{route}": 0.0 for route in ("messages", "responses")}
    with guard(sim, deepseek_dir, **shares) as server:
        yield server.url


@pytest.fixture
def claude(proxy: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy, api_key="unused", max_retries=0, timeout=60)


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


def claude_code(claude: anthropic.Anthropic, text: str, budget: int = 16000) -> Any:
    system: Any = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=0"},
                   {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}]  # fmt: skip
    tools: Any = [TOOL]
    return claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=32000, system=system, tools=tools, tool_choice={"type": "none"},
        thinking={"type": "enabled", "budget_tokens": budget}, messages=[{"role": "user", "content": text}],
    )  # fmt: skip


def test_claude_codes_thinking_budget_is_lowered_with_its_max_tokens(
    claude: anthropic.Anthropic, sim: InMemorySim
) -> None:
    raw = claude_code(claude, "List the files.")
    reply = raw.parse()
    limit = int(raw.headers["x-token-guard-max-tokens"])
    assert raw.headers["x-token-guard-action"] == "clamp" and limit == WINDOW - reply.usage.input_tokens
    assert raw.headers["x-token-guard-thinking"] == "budget_tokens=1024"  # half of the limit is below vLLM's 1024
    sent = sim.stats.requests[-1]
    assert sent["max_tokens"] == limit and sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}


def test_thinking_is_turned_off_when_no_budget_fits_under_the_limit(
    claude: anthropic.Anthropic, sim: InMemorySim
) -> None:
    raw = claude_code(claude, essay(700))
    reply = raw.parse()
    assert int(raw.headers["x-token-guard-max-tokens"]) <= 1024
    assert raw.headers["x-token-guard-thinking"] == "disabled"
    assert sim.stats.requests[-1]["thinking"] == {"type": "disabled"}
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == reply.usage.input_tokens  # counted again, exactly
    assert reply.usage.input_tokens + reply.usage.output_tokens == WINDOW


@pytest.mark.parametrize(("words", "change"), [(3, "lowered"), (700, "disabled")])
def test_the_log_line_and_metrics_say_what_became_of_the_thinking_budget(
    claude: anthropic.Anthropic, proxy: str, caplog: pytest.LogCaptureFixture, words: int, change: str
) -> None:
    """Not only x-token-guard-thinking: the request's log line says the budget was lowered (and to what) or thinking
    turned off, as every other change its headers tell, and token_guard_thinking_changes_total counts it."""
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    labels = {"model": MODEL, "endpoint": "/v1/messages", "change": change}
    before = metric(httpx.get(f"{proxy}/metrics").text, "token_guard_thinking_changes_total", **labels)
    rid = f"thinking-{change}"
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=32000, thinking={"type": "enabled", "budget_tokens": 16000},
        messages=[{"role": "user", "content": essay(words)}], extra_headers={"x-request-id": rid},
    )  # fmt: skip
    fields = logged(caplog, rid)
    assert fields["thinking"] == change and as_headers(fields) == changes_told(raw.headers)
    assert ("thinking_budget" in fields) == (change == "lowered")
    after = metric(httpx.get(f"{proxy}/metrics").text, "token_guard_thinking_changes_total", **labels)
    assert after - before == 1


def test_a_budget_that_fits_is_forwarded_as_sent(claude: anthropic.Anthropic, sim: InMemorySim) -> None:
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=1500, thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": "Hi"}],
    )  # fmt: skip
    assert raw.headers["x-token-guard-action"] == "pass" and "x-token-guard-thinking" not in raw.headers
    assert sim.stats.requests[-1]["thinking"]["budget_tokens"] == 1024


def test_a_budget_vllm_refuses_is_a_400_in_anthropics_envelope(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError, match="at least 1024"):
        claude.messages.create(model=MODEL, max_tokens=32000, thinking={"type": "enabled", "budget_tokens": 500},
                               messages=[{"role": "user", "content": "Hi"}])  # fmt: skip


def test_health_says_when_the_start_up_check_has_run(proxy: str) -> None:
    assert httpx.get(f"{proxy}/health").json() == {"status": "ok", "models": [MODEL], "checked": True}


def test_a_second_responses_turn_is_clamped_to_the_room_its_own_part_leaves(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "input": "next", "previous_response_id": "resp_x", "max_output_tokens": 100000}
    response = httpx.post(f"{proxy}/v1/responses", json=body)
    prompt = int(response.headers["x-token-guard-prompt-tokens"])
    assert response.headers["x-token-guard-action"] == "partial"
    assert int(response.headers["x-token-guard-max-tokens"]) == WINDOW - prompt
    assert sim.stats.requests[-1]["max_output_tokens"] == WINDOW - prompt


def test_truncation_auto_is_cut_by_vllm_with_room_kept_for_the_answer(proxy: str) -> None:
    oai = openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0)
    raw = oai.responses.with_raw_response.create(model=MODEL, input=essay(3000), truncation="auto",
                                                 max_output_tokens=100000)  # fmt: skip
    reply = raw.parse()
    assert raw.headers["x-token-guard-action"] == "clamp" and raw.headers["x-token-guard-max-tokens"] == "1024"
    assert int(raw.headers["x-token-guard-prompt-tokens"]) > WINDOW
    assert reply.usage is not None and (reply.usage.input_tokens, reply.usage.output_tokens) == (1024, 1024)


def chat(stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40, "stream": stream}


async def flood(url: str, count: int, stream: bool) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        calls = [client.post(f"{url}/v1/chat/completions", json=chat(stream)) for _ in range(count)]
        return await asyncio.gather(*calls)


@pytest.mark.parametrize("stream", [False, True])
def test_a_replica_whose_queue_is_full_is_retried_on_another(deepseek_dir: Path, stream: bool) -> None:
    with (
        simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.01, max_num_queued_reqs=2) as (first, one, _),
        simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.01, max_num_queued_reqs=2) as (second, two, _),
        guard(first.url, deepseek_dir, **{"upstream.urls": f"{first.url},{second.url}"}) as proxy,
    ):
        answers = asyncio.run(flood(proxy.url, 4, stream))
    assert [a.status_code for a in answers] == [200] * 4
    assert not any('"error"' in a.text for a in answers)
    assert one.received + two.received >= 4


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_queue_on_every_replica_is_a_429_with_retry_after(deepseek_dir: Path, stream: bool) -> None:
    with (
        simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.02, max_num_queued_reqs=1) as (sim, stats, _),
        guard(sim.url, deepseek_dir) as proxy,
    ):
        answers = asyncio.run(flood(proxy.url, 4, stream))
    busy = [a for a in answers if a.status_code == 429]
    assert busy and len(busy) + sum(a.status_code == 200 for a in answers) == 4
    error = busy[0].json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "queue limit" in error["message"]
    assert int(busy[0].headers["retry-after"]) >= 1
    assert not any('"error"' in a.text for a in answers if a.status_code == 200)


def test_a_full_queue_on_the_messages_route_is_a_429_in_anthropics_envelope(deepseek_dir: Path) -> None:
    body = {"model": MODEL, "max_tokens": 40, "messages": [{"role": "user", "content": "Hi"}]}

    async def run(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(f"{url}/v1/messages", json=body) for _ in range(4)))

    with (
        simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.02, max_num_queued_reqs=1) as (sim, _, _),
        guard(sim.url, deepseek_dir) as proxy,
    ):
        answers = asyncio.run(run(proxy.url))
    busy = [a for a in answers if a.status_code == 429]
    assert busy and busy[0].json()["type"] == "error" and "retry-after" in busy[0].headers

"""The request fields vLLM 0.34 added, as the simulator's 0.34 profile answers them and 0.33's ignores or refuses
them: Messages `min_tokens`, chat `tools: []`, Responses `thinking_token_budget`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import zoo
from tests.support.servers import MODEL, InMemorySim, simulator_in_memory

USER: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def sim(request: pytest.FixtureRequest) -> Iterator[tuple[str, InMemorySim]]:
    with simulator_in_memory(zoo.family_dir("qwen3"), profile=request.param, max_model_len=256) as running:
        yield request.param, running


def test_messages_min_tokens_above_max_tokens(sim: tuple[str, InMemorySim]) -> None:
    profile, running = sim
    answer = running.client.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": USER,
                                                       "min_tokens": 6})  # fmt: skip
    if profile == "0.33":
        assert answer.status_code == 200
        return
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "min_tokens must be less than or equal to max_tokens=5, got 6."


@pytest.mark.parametrize("choice", [None, "auto", "required"])
def test_chat_empty_tools(sim: tuple[str, InMemorySim], choice: str | None) -> None:
    profile, running = sim
    extra = {} if choice is None else {"tool_choice": choice}
    body = {"model": MODEL, "max_tokens": 2, "messages": USER, "tools": [], **extra}
    answer = running.client.post("/v1/chat/completions", json=body)
    if profile == "0.33":
        assert answer.status_code == 400 and "`tools` must not be an empty array" in answer.json()["error"]["message"]
        return
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"].get("tool_calls") in (None, [])  # "required" turned to "none"


def test_chat_empty_tools_with_a_named_tool_choice_is_refused(sim: tuple[str, InMemorySim]) -> None:
    _, running = sim
    named = {"type": "function", "function": {"name": "f"}}
    body = {"model": MODEL, "max_tokens": 2, "messages": USER, "tools": [], "tool_choice": named}
    assert running.client.post("/v1/chat/completions", json=body).status_code == 400


@pytest.mark.parametrize("budget", [10, 2.5, -2])
def test_responses_thinking_budget(sim: tuple[str, InMemorySim], budget: Any) -> None:
    profile, running = sim
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 20, "thinking_token_budget": budget}
    answer = running.client.post("/v1/responses", json=body)
    if profile == "0.33":  # an unknown field
        assert answer.status_code == 200
        return
    assert answer.status_code == 400  # a bad value, or a budget without a reasoning parser
    expected = "reasoning_config is not configured" if budget == 10 else "must be a non-negative integer or -1"
    assert expected in answer.json()["error"]["message"]


def test_responses_unlimited_thinking_budget_needs_no_parser(sim: tuple[str, InMemorySim]) -> None:
    _, running = sim
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 20, "thinking_token_budget": -1}
    assert running.client.post("/v1/responses", json=body).status_code == 200

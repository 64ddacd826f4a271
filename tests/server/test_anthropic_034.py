"""What vLLM 0.34 changed on the Anthropic routes, through the guard in front of the simulator's 0.34 and 0.32
profiles: `thinking: {"type": "between_tools"}` ("off up front") taken and rendered as disabled thinking (0.33 and
earlier refuse it), counted as 0.34 renders it (Qwen3's real template, where thinking off adds an empty think block);
and count_tokens counting a prompt longer than the window (0.33 and earlier: 400), where the guard answers the count
itself."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

MESSAGES: Any = [{"role": "user", "content": "List the files in this directory."}]


WINDOW = 256


@pytest.fixture(scope="module", params=["0.32", "0.34"])
def claude(request: pytest.FixtureRequest) -> Iterator[tuple[str, anthropic.Anthropic, InMemorySim]]:
    tokenizer = zoo.family_dir("qwen3")
    with (
        simulator_in_memory(tokenizer, profile=request.param, max_model_len=WINDOW) as sim,
        guard(sim, tokenizer) as proxy,
    ):
        yield request.param, anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0), sim


def counted(claude: anthropic.Anthropic, thinking: Any) -> tuple[int, int]:
    """(the guard's count, vLLM's input_tokens) of one Messages request."""
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=5, messages=MESSAGES, thinking=thinking)
    return int(raw.headers["x-token-guard-prompt-tokens"]), raw.parse().usage.input_tokens


def test_between_tools_is_counted_as_vllm_034_renders_it(claude: tuple[str, anthropic.Anthropic, InMemorySim]) -> None:
    profile, client, _ = claude
    if profile == "0.32":
        with pytest.raises(anthropic.BadRequestError, match="between_tools|does not match"):
            counted(client, {"type": "between_tools"})
        return
    guard_count, charged = counted(client, {"type": "between_tools"})
    assert guard_count == charged
    assert charged == counted(client, {"type": "disabled"})[1]  # rendered as disabled thinking
    assert charged != counted(client, {"type": "adaptive"})[1]  # which the template renders differently


def test_count_tokens_counts_past_the_window_on_034(claude: tuple[str, anthropic.Anthropic, InMemorySim]) -> None:
    profile, client, sim = claude
    long: Any = [{"role": "user", "content": " ".join(f"word{i}" for i in range(WINDOW))}]
    if profile == "0.32":
        with pytest.raises(anthropic.BadRequestError, match="maximum context length"):
            client.messages.count_tokens(model=MODEL, messages=long)
        return
    raw = client.messages.with_raw_response.count_tokens(model=MODEL, messages=long)
    assert raw.headers["x-token-guard-action"] == "count"  # answered by the guard itself
    direct = sim.client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": long})
    assert direct.status_code == 200 and raw.parse().input_tokens == direct.json()["input_tokens"] > WINDOW


TOOL: Any = {"name": "tool_search", "description": "Find a tool.", "input_schema": {"type": "object", "properties": {}}}
REFERENCED: Any = [
    {"role": "user", "content": "Find me a tool for the weather."},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "tool_search", "input": {}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
        {"type": "tool_reference", "tool_name": "get_weather"}, {"type": "text", "text": "One tool found."}]}]},
]  # fmt: skip


def test_a_tool_result_with_tool_references_is_counted_as_the_release_renders_it(
    claude: tuple[str, anthropic.Anthropic, InMemorySim],
) -> None:
    """0.34 gives the result's tool references and its text one tool message; 0.33 and earlier two (the text, then
    the references): the guard counts each release's."""
    _, client, _ = claude
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=5, messages=REFERENCED, tools=[TOOL])
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == raw.parse().usage.input_tokens


def test_min_tokens_follows_the_clamped_max_tokens_on_034(claude: tuple[str, anthropic.Anthropic, InMemorySim]) -> None:
    profile, client, sim = claude
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=1000, messages=MESSAGES,
                                                   extra_body={"min_tokens": 900})  # fmt: skip
    limit = int(raw.headers["x-token-guard-max-tokens"])
    assert raw.headers["x-token-guard-action"] == "clamp" and limit < WINDOW
    sent = sim.stats.requests[-1]
    assert sent["max_tokens"] == limit
    assert sent["min_tokens"] == (limit if profile == "0.34" else 900)  # earlier releases ignore the field
    assert raw.parse().usage.input_tokens == int(raw.headers["x-token-guard-prompt-tokens"])


def test_min_tokens_above_max_tokens_is_refused_as_034_refuses_it(
    claude: tuple[str, anthropic.Anthropic, InMemorySim],
) -> None:
    profile, client, sim = claude
    if profile == "0.32":  # the field is ignored
        answer = client.messages.create(model=MODEL, max_tokens=5, messages=MESSAGES, extra_body={"min_tokens": 6})
        assert answer.usage.output_tokens <= 5
        return
    received = sim.stats.received
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model=MODEL, max_tokens=5, messages=MESSAGES, extra_body={"min_tokens": 6})
    assert sim.stats.received == received  # refused by the guard
    body = {"model": MODEL, "max_tokens": 5, "messages": MESSAGES, "min_tokens": 6}
    direct = sim.client.post("/v1/messages", json=body)
    assert direct.status_code == refused.value.status_code == 400
    assert refused.value.body == direct.json()

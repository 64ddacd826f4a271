"""What vLLM 0.34 changed on chat that the guard's count and acceptance follow, through the guard in front of the
simulator's 0.33 and 0.34 profiles: `tools: []` refused by 0.33 (and earlier), read as no tools by 0.34, where Llama
3.1's real template renders an empty list unlike none (its tool preamble), so the count must be of no tools."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

MESSAGES: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
WINDOW = 512


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def chat(request: pytest.FixtureRequest) -> Iterator[tuple[str, openai.OpenAI, InMemorySim]]:
    tokenizer = zoo.family_dir("llama3.1")
    with (
        simulator_in_memory(tokenizer, profile=request.param, max_model_len=WINDOW) as sim,
        guard(sim, tokenizer) as proxy,
    ):
        yield request.param, openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0), sim


@pytest.mark.parametrize("choice", [None, "auto", "required"])
def test_empty_tools_are_counted_as_034_reads_them(
    chat: tuple[str, openai.OpenAI, InMemorySim], choice: str | None
) -> None:
    profile, client, sim = chat
    extra: Any = {} if choice is None else {"tool_choice": choice}
    if profile == "0.33":
        received = sim.stats.received
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[], max_tokens=4000, **extra)
        assert sim.stats.received == received  # refused by the guard, as vLLM refuses it
        direct = sim.client.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "tools": []})
        assert direct.status_code == refused.value.status_code == 400
        assert refused.value.body == direct.json()["error"]
        return
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, tools=[], max_tokens=4000,
                                                           **extra)  # fmt: skip
    assert raw.headers["x-token-guard-action"] == "clamp"  # served, its limit lowered to the window
    usage, plain = raw.parse().usage, client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4).usage
    assert usage is not None and plain is not None
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == usage.prompt_tokens
    assert usage.prompt_tokens == plain.prompt_tokens  # rendered as no tools


def test_a_named_tool_among_no_tools_is_still_refused(chat: tuple[str, openai.OpenAI, InMemorySim]) -> None:
    _, client, _ = chat
    named: Any = {"type": "function", "function": {"name": "weather"}}
    with pytest.raises(openai.BadRequestError, match="tool"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[], tool_choice=named, max_tokens=4)

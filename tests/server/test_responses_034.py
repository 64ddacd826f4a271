"""What vLLM 0.34 changed on the Responses API that the guard's limits follow, through the guard in front of the
simulator's 0.33 and 0.34 profiles (with a reasoning parser, which 0.34 needs to take a thinking budget):
`thinking_token_budget`, lowered to its share of a clamped `max_output_tokens` in front of 0.34 (0.33 ignores it, and
the guard leaves it as sent)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

WINDOW = 256
ASKED, BUDGET = 1000, 600


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def client(request: pytest.FixtureRequest) -> Iterator[tuple[str, openai.OpenAI, InMemorySim]]:
    tokenizer = zoo.family_dir("qwen3")
    with (
        simulator_in_memory(tokenizer, profile=request.param, max_model_len=WINDOW, reasoning_parser="qwen3") as sim,
        guard(sim, tokenizer) as proxy,
    ):
        yield request.param, openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0), sim


def test_thinking_budget_keeps_its_share_of_a_clamped_limit(client: tuple[str, openai.OpenAI, InMemorySim]) -> None:
    profile, oai, sim = client
    raw = oai.responses.with_raw_response.create(model=MODEL, input="Think it over: is 91 a prime?",
                                                 max_output_tokens=ASKED,
                                                 extra_body={"thinking_token_budget": BUDGET})  # fmt: skip
    limit = int(raw.headers["x-token-guard-max-tokens"])
    assert raw.headers["x-token-guard-action"] == "clamp" and limit < WINDOW
    sent = sim.stats.requests[-1]
    assert sent["max_output_tokens"] == limit
    assert sent["thinking_token_budget"] == (BUDGET * limit // ASKED if profile == "0.34" else BUDGET)
    usage = raw.parse().usage
    assert usage is not None and usage.input_tokens == int(raw.headers["x-token-guard-prompt-tokens"])


def test_a_thinking_budget_within_the_limit_is_left_as_sent(client: tuple[str, openai.OpenAI, InMemorySim]) -> None:
    _, oai, sim = client
    answer = oai.responses.create(model=MODEL, input="Is 91 a prime?", max_output_tokens=20,
                                  extra_body={"thinking_token_budget": 10})  # fmt: skip
    assert answer.status in ("completed", "incomplete")
    assert sim.stats.requests[-1]["thinking_token_budget"] == 10 and sim.stats.requests[-1]["max_output_tokens"] == 20

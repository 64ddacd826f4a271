"""Chat's and completions' `thinking_token_budget` (vLLM 0.31+) under an output limit the guard clamps: it keeps its
share of the output, as the Responses and Anthropic budgets do, instead of letting the reasoning take the whole of the
lowered limit; within the limit, it is left as sent."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

WINDOW = 256
ASKED, BUDGET = 1000, 600


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[openai.OpenAI, InMemorySim]]:
    tokenizer = zoo.family_dir("qwen3")
    with (
        simulator_in_memory(tokenizer, profile="0.32", max_model_len=WINDOW, reasoning_parser="qwen3") as sim,
        guard(sim, tokenizer) as proxy,
    ):
        yield openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0), sim


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_budget_keeps_its_share_of_a_clamped_limit(
    served: tuple[openai.OpenAI, InMemorySim], field: str
) -> None:
    oai, sim = served
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Think it over: is 91 a prime?"}],
        extra_body={field: ASKED, "thinking_token_budget": BUDGET},
    )  # fmt: skip
    limit = int(raw.headers["x-token-guard-max-tokens"])
    assert raw.headers["x-token-guard-action"] == "clamp" and limit < WINDOW
    sent = sim.stats.requests[-1]
    assert sent[field] == limit and sent["thinking_token_budget"] == BUDGET * limit // ASKED


def test_a_completions_budget_keeps_its_share_of_a_clamped_limit(served: tuple[openai.OpenAI, InMemorySim]) -> None:
    oai, sim = served
    raw = oai.completions.with_raw_response.create(
        model=MODEL, prompt="Is 91 a prime?", max_tokens=ASKED, extra_body={"thinking_token_budget": BUDGET}
    )
    limit = int(raw.headers["x-token-guard-max-tokens"])
    sent = sim.stats.requests[-1]
    assert sent["max_tokens"] == limit < WINDOW and sent["thinking_token_budget"] == BUDGET * limit // ASKED


@pytest.mark.parametrize("budget", [10, -1])
def test_a_budget_within_the_limit_or_unlimited_is_left_as_sent(
    served: tuple[openai.OpenAI, InMemorySim], budget: int
) -> None:
    oai, sim = served
    asked = 20 if budget == 10 else ASKED
    oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is 91 a prime?"}],
                                max_tokens=asked, extra_body={"thinking_token_budget": budget})  # fmt: skip
    assert sim.stats.requests[-1]["thinking_token_budget"] == budget

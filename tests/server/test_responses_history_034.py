"""Responses histories that hit each branch vLLM 0.34 changed in turning input items into chat messages, sent
through the real `openai` SDK to the guard in front of the simulator's 0.33 and 0.34 profiles
(tests/support/responses_history.py): what vLLM reads, the guard counts as the usage vLLM charges; what it refuses
or fails on (0.33: an output message without content, an assistant item without a type, a reasoning dict), the guard
answers with a 400 of its own or vLLM's."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.support import zoo
from tests.support.responses_history import FAILS, HISTORIES, REFUSED, History
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

CASES = [h for h in HISTORIES if h.name != "an output message opening with a refusal"]  # 400 either way, below
# 0.33 renders this message's file part itself, which the guard refuses: it counts text-only prompts
FILE_PART = "an assistant dict whose first part has no text"


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def client(request: pytest.FixtureRequest) -> Iterator[tuple[str, openai.OpenAI, InMemorySim]]:
    tokenizer = zoo.family_dir("qwen3")  # renders the reasoning of the turn after the last user message
    with (
        simulator_in_memory(tokenizer, profile=request.param, max_model_len=4096) as sim,
        guard(sim, tokenizer) as proxy,
    ):
        yield request.param, openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0), sim


@pytest.mark.parametrize("history", CASES, ids=[h.name for h in CASES])
def test_counted_as_vllm_charges_or_refused(history: History, client: tuple[str, openai.OpenAI, InMemorySim]) -> None:
    profile, oai, sim = client
    expected = history.since if profile == "0.34" else history.before
    forwarded = len(sim.stats.requests)
    if profile == "0.33" and history.name == FILE_PART:
        with pytest.raises(openai.BadRequestError, match="is not a text part"):
            oai.responses.create(model=MODEL, input=history.items, max_output_tokens=4)  # type: ignore[arg-type]
        return
    if expected in (REFUSED, FAILS):
        with pytest.raises(openai.BadRequestError) as refused:
            oai.responses.create(model=MODEL, input=history.items, max_output_tokens=4)  # type: ignore[arg-type]
        assert refused.value.status_code == 400
        if expected == FAILS:  # the guard's own answer: vLLM would fail with a 500
            assert len(sim.stats.requests) == forwarded
        return
    raw = oai.responses.with_raw_response.create(model=MODEL, input=history.items, max_output_tokens=4)  # type: ignore[arg-type]
    usage = raw.parse().usage
    assert usage is not None and usage.input_tokens == int(raw.headers["x-token-guard-prompt-tokens"])
    assert raw.headers["x-token-guard-action"] == "pass"


def test_an_output_message_opening_with_a_refusal_is_refused(client: tuple[str, openai.OpenAI, InMemorySim]) -> None:
    _, oai, sim = client
    forwarded = len(sim.stats.requests)
    refusal = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=MODEL, input=[{"role": "user", "content": "Hi"}, refusal], max_output_tokens=4)  # type: ignore[list-item]
    assert len(sim.stats.requests) == forwarded  # vLLM fails on it with a 500, every release

"""What agent clients send, answered as vLLM 0.31/0.32 answer it: Responses `truncation: "auto"` (the input cut to
its last tokens), Anthropic thinking budgets (vLLM's request model, and the engine's need for a reasoning parser),
and the 503 of a full request queue (--max-num-queued-reqs)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from simulator import SimulatorSettings
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
    running_simulator,
)

WINDOW = 2048


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


def test_truncation_auto_keeps_the_last_tokens_less_the_output_limit_on_031(sim031: RunningSim) -> None:
    body = {"model": "tiny", "input": essay(3000), "truncation": "auto", "max_output_tokens": 100}
    answer = sim031.client.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (WINDOW - 100, 100)


def test_truncation_auto_keeps_all_but_one_token_on_032(sim032: RunningSim) -> None:
    body = {"model": "tiny", "input": essay(3000), "truncation": "auto", "max_output_tokens": 100}
    answer = sim032.client.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (WINDOW - 1, 1)


def test_truncation_null_cuts_as_auto_does(sim032: RunningSim) -> None:
    """build_tok_params asks for truncate_prompt_tokens -1 whenever truncation is not "disabled": null too."""
    body = {"model": "tiny", "input": essay(3000), "truncation": None, "max_output_tokens": 100}
    answer = sim032.client.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["input_tokens"] == WINDOW - 1


def test_truncation_auto_without_a_limit_or_over_the_window_is_refused(sim: RunningSim) -> None:
    unsaid = sim.client.post("/v1/responses", json={"model": "tiny", "input": essay(3000), "truncation": "auto"})
    assert unsaid.status_code == 400 and "max_tokens must be at least 1, got 0" in unsaid.json()["error"]["message"]
    over = {"model": "tiny", "input": "hi", "truncation": "auto", "max_output_tokens": 100_000}
    refused = sim.client.post("/v1/responses", json=over)
    assert refused.status_code == 400
    assert "max_output_tokens=100000 cannot be greater than max_model_len=2048" in refused.json()["error"]["message"]


def test_truncation_disabled_refuses_an_input_over_the_window(sim: RunningSim) -> None:
    body = {"model": "tiny", "input": essay(3000), "max_output_tokens": 100}
    assert sim.client.post("/v1/responses", json=body).status_code == 400


def messages(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "says"),
    [
        ({"type": "enabled", "budget_tokens": 1000}, 2000, "greater than or equal to 1024"),  # Field(ge=1024)
        ({"type": "enabled", "budget_tokens": 1500}, 1500, "must be less than max_tokens"),
        ({"type": "enabled", "budget_tokens": 1024}, 1500, "reasoning_config is not configured"),
    ],
)
def test_thinking_budgets_are_checked_as_vllm_checks_them(
    sim: RunningSim, thinking: dict[str, Any], max_tokens: int, says: str
) -> None:
    answer = sim.client.post("/v1/messages", json=messages(max_tokens=max_tokens, thinking=thinking))
    assert answer.status_code == 400 and says in answer.json()["error"]["message"]
    assert answer.json()["type"] == "error"


def test_a_thinking_budget_is_served_with_a_reasoning_parser(sim_tokenizer_dir: Path) -> None:
    settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, profile="0.31", reasoning_parser="deepseek_r1")
    with running_simulator(settings) as sim:
        body = messages(max_tokens=1500, thinking={"type": "enabled", "budget_tokens": 1024})
        answer = sim.client.post("/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        over = sim.client.post("/v1/messages", json={**body, "max_tokens": 32000})
        assert over.status_code == 400 and "cannot be greater than max_model_len" in over.text


def test_a_full_request_queue_answers_503(sim_tokenizer_dir: Path) -> None:
    settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, itl_s=0.01, max_num_queued_reqs=1)

    async def flood(url: str) -> list[httpx.Response]:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(4)))

    with running_simulator(settings) as sim:
        answers = asyncio.run(flood(sim.url))
    statuses = sorted(a.status_code for a in answers)
    assert statuses[0] == 200 and statuses[-1] == 503
    busy = next(a for a in answers if a.status_code == 503).json()["error"]
    assert busy["type"] == "Service Unavailable" and "cannot accept new requests" in busy["message"]


def test_a_full_request_queue_answers_a_stream_with_an_error_event(sim_tokenizer_dir: Path) -> None:
    # measured on vLLM 0.32: the stream has started when the engine refuses it, so 200 and the error as an event
    settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, itl_s=0.01, max_num_queued_reqs=1)

    async def flood(url: str) -> list[httpx.Response]:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True}
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await asyncio.gather(*(client.post("/v1/chat/completions", json=body) for _ in range(4)))

    with running_simulator(settings) as sim:
        answers = asyncio.run(flood(sim.url))
    assert {a.status_code for a in answers} == {200}
    refused = [a.text for a in answers if a.text.startswith('data: {"error": ')]
    assert refused and all(r.endswith("data: [DONE]\n\n") and '"code": 503' in r for r in refused)

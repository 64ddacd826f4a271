"""The simulator's /invocations dispatch, as vLLM 0.31 / 0.32's SageMaker router dispatches a body (the first request
model that validates it whole: chat, then completions), read on its own: a body holding the prompts of two endpoints
runs one of them, as in vLLM, where the guard refuses it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sim_fixtures import RunningSim, fixture_sim032, fixture_sim_tokenizer_dir  # noqa: F401

HI = [{"role": "user", "content": "hi"}]


def invoke(sim: RunningSim, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = sim.client.post("/invocations", json={"max_tokens": 2, **body})
    answer: dict[str, Any] = response.json()
    return response.status_code, answer


@pytest.mark.parametrize(
    ("body", "runs"),
    [
        ({"messages": HI, "prompt": "x"}, "chat.completion"),  # chat validates first
        ({"messages": HI, "prompt": "x", "logprobs": 5}, "text_completion"),  # chat's logprobs is a boolean
        ({"messages": HI, "logprobs": True}, "chat.completion"),
        ({"prompt": "x", "input": "y"}, "text_completion"),  # completions before any pooling route
        ({"prompt": [[1, 2], [3]]}, "text_completion"),
        ({"input": "y"}, "list"),
        ({"query": "q", "documents": ["d"]}, "rerank"),
    ],
)
def test_the_first_request_model_that_takes_the_body_runs_it(
    sim032: RunningSim, body: dict[str, Any], runs: str
) -> None:
    status, answer = invoke(sim032, body)
    assert status == 200, answer
    assert answer.get("object", "rerank" if "results" in answer else None) == runs


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"),
        ({"prompt": ""}, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"),
        ({"prompt": {"text": "x"}}, "Cannot find suitable handler for request. Expected one of: "
                                    "['ChatCompletionRequest', 'CompletionRequest']"),
        ({"messages": [{"content": "no role"}], "prompt": [1, "a"]}, "Cannot find suitable handler for request. "
                                                                     "Expected one of: ['ChatCompletionRequest', "
                                                                     "'CompletionRequest']"),
    ],
)  # fmt: skip
def test_a_body_no_request_model_takes_gets_vllms_400(sim032: RunningSim, body: dict[str, Any], message: str) -> None:
    status, answer = invoke(sim032, body)
    assert status == 400
    assert answer["error"]["message"] == message

"""The simulator's /inference/v1/generate: token ids in, token ids out, in each version's shape (captured from
real vLLM 0.31 and 0.32 with --enable-scale-out); the engine's length rules."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)

PATH = "/inference/v1/generate"
WINDOW = 2048


def generate(sim: RunningSim, **body: Any) -> dict[str, Any]:
    response = sim.client.post(PATH, json=body, headers={"x-request-id": "r1"})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_each_versions_answer(sim031: RunningSim, sim032: RunningSim) -> None:
    old = generate(sim031, token_ids=[1, 2, 3, 4], sampling_params={"max_tokens": 3})
    assert list(old) == ["request_id", "model", "created", "choices", "usage", "prompt_logprobs",
                         "prompt_token_id_logprobs", "prompt_token_ids", "mm_placeholders", "metrics",
                         "kv_transfer_params", "ec_transfer_params"]  # fmt: skip
    assert list(old["choices"][0]) == ["index", "logprobs", "finish_reason", "token_ids", "routed_experts",
                                       "sampling_mask"]  # fmt: skip
    new = generate(sim032, token_ids=[1, 2, 3, 4], sampling_params={"max_tokens": 3})
    assert list(new)[-2:] == ["output_mode", "choices"] and new["output_mode"] == "tokens"
    assert new["choices"][0]["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
    for answer in (old, new):
        assert answer["request_id"] == "generate-tokens-r1" and len(answer["choices"][0]["token_ids"]) == 3
        assert answer["usage"]["prompt_tokens"] == 4 and answer["usage"]["completion_tokens"] == 3


def test_the_engine_fills_or_stops_at_the_window(sim032: RunningSim) -> None:
    ids = [5] * (WINDOW - 8)
    assert generate(sim032, token_ids=ids, sampling_params={})["usage"]["completion_tokens"] == 8
    assert generate(sim032, token_ids=ids, sampling_params={"max_tokens": None})["usage"]["completion_tokens"] == 8
    clamped = generate(sim032, token_ids=ids, sampling_params={"max_tokens": 30, "min_tokens": 20})
    assert clamped["usage"]["completion_tokens"] == 8  # no error: min_tokens is checked against the 30 asked for
    assert generate(sim032, token_ids=[1], sampling_params={"n": 2, "max_tokens": 2})["usage"]["completion_tokens"] == 4


def test_a_stream_has_usage_only_when_asked(sim031: RunningSim, sim032: RunningSim) -> None:
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2}, "stream": True}
    for sim in (sim031, sim032):
        plain = sim.client.post(PATH, json=body).text.split("\n\n")
        assert plain[-2:] == ["data: [DONE]", ""] and len(plain) == 4
        told = sim.client.post(PATH, json={**body, "stream_options": {"include_usage": True}}).text.split("\n\n")
        final = json.loads(told[-3].removeprefix("data: "))
        assert final["choices"] == [] and final["usage"] == {"prompt_tokens": 2, "total_tokens": 4,
                                                             "completion_tokens": 2}  # fmt: skip
        assert json.loads(told[1].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    "body,fragment",
    [
        (
            {"token_ids": [5] * (WINDOW + 1), "sampling_params": {}},
            "The decoder prompt (length 2049) is longer than the maximum model length of 2048.",
        ),
        (
            {"token_ids": [5] * WINDOW, "sampling_params": {}},
            "The decoder prompt (length 2048) plus the number of requested output tokens (at least 1)",
        ),
        ({"token_ids": [], "sampling_params": {}}, "'loc': 'body.token_ids', 'msg': 'List should have at least 1"),
        ({"token_ids": [-1], "sampling_params": {}}, "token_ids must not contain negative values"),
        ({"token_ids": [1]}, "'loc': 'body.sampling_params', 'msg': 'Field required'"),
        (
            {"token_ids": [1], "sampling_params": {"max_tokens": 0}},
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
        ),
        (
            {"token_ids": [1], "sampling_params": {"max_tokens": 2, "min_tokens": 5}},
            "min_tokens must be less than or equal to max_tokens=2, got 5.",
        ),
    ],
)
def test_vllms_refusals(sim032: RunningSim, body: dict[str, Any], fragment: str) -> None:
    response = sim032.client.post(PATH, json=body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]

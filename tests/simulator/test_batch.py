"""The simulator's batch chat route: one chat.completion per batch, a choice per conversation, usage summed; each
conversation held to the version's length rules, as vLLM 0.31 / 0.32 answered (captured from real vLLM)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)

PATH = "/v1/chat/completions/batch"
HI = [{"role": "user", "content": "Hi"}]
LONG = [{"role": "user", "content": "word " * 2030}]


def count(sim: RunningSim, messages: list[dict[str, Any]]) -> int:
    tokens: int = sim.client.post("/tokenize", json={"messages": messages}).json()["count"]
    return tokens


def test_one_body_whose_choices_are_the_conversations_and_whose_usage_sums_them(sim032: RunningSim) -> None:
    second = [{"role": "user", "content": "Hello there, how are you?"}]
    response = sim032.client.post(PATH, json={"messages": [HI, second], "max_tokens": 3, "stream": True,
                                               "tools": [{"type": "function", "function": {"name": "f"}}]},
                                  headers={"x-request-id": "r1"})  # fmt: skip
    body = response.json()
    assert response.status_code == 200 and body["id"] == "chatcmpl-r1" and body["object"] == "chat.completion"
    assert [c["index"] for c in body["choices"]] == [0, 1] and body["choices"][1]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == count(sim032, HI) + count(sim032, second)  # rendered without tools
    assert body["usage"]["completion_tokens"] == 6 and body["prompt_token_ids"] is None


def test_each_conversation_gets_its_own_role(sim032: RunningSim) -> None:
    ended = [*HI, {"role": "assistant", "content": "Hel"}]
    body = sim032.client.post(PATH, json={"messages": [HI, ended], "add_generation_prompt": False,
                                          "continue_final_message": True, "max_tokens": 1}).json()  # fmt: skip
    assert [c["message"]["role"] for c in body["choices"]] == ["user", "assistant"]


def test_031_refuses_a_conversation_that_overflows_and_032_clamps_it(sim031: RunningSim, sim032: RunningSim) -> None:
    request = {"messages": [HI, LONG], "max_tokens": 30}
    refused = sim031.client.post(PATH, json=request)
    assert refused.status_code == 400 and "you requested 30 output tokens" in refused.json()["error"]["message"]
    usage = sim032.client.post(PATH, json=request).json()["usage"]
    assert usage["completion_tokens"] == 30 + (2048 - count(sim032, LONG))


@pytest.mark.parametrize(
    "body,status,fragment",
    [
        (
            {"messages": [HI], "n": 2},
            400,
            "Batch chat completions do not support `n > 1`. Please set `n` to 1. (parameter=n, value=2)",
        ),
        ({"messages": [HI], "use_beam_search": True}, 400, "do not support beam search"),
        ({"messages": [HI, []]}, 400, "'loc': 'body.messages.1', 'msg': 'List should have at least 1 item"),
        ({"messages": HI}, 400, "'loc': 'body.messages.0', 'msg': 'Input should be a valid list'"),
        ({"messages": [HI], "model": "nope"}, 404, "The model `nope` does not exist. Valid aliases: tiny."),
    ],
)
def test_vllms_refusals(sim032: RunningSim, body: dict[str, Any], status: int, fragment: str) -> None:
    response = sim032.client.post(PATH, json=body)
    assert response.status_code == status and fragment in response.json()["error"]["message"]

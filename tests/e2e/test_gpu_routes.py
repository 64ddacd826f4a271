"""Batch chat and token-in generation against a real vLLM 0.31.0 and 0.32.0 (started with --enable-scale-out, which
/inference/v1/generate needs): the guard's count equals what vLLM charges (`usage.prompt_tokens`, for a batch the sum
over its conversations), an output limit over the room is clamped where vLLM 0.31 alone refuses a batch, and a prompt
that cannot fit is refused without reaching vLLM. Cohere's /v2/embed is in test_pooling.py (an embedding model)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.runtime import MAX_MODEL_LEN, SERVED_NAME
from tests.e2e.stack import Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_MAX, GUARD_PROMPT, requests_seen, sized_chat, words

pytestmark = pytest.mark.e2e

BATCH, GENERATE = "/v1/chat/completions/batch", "/inference/v1/generate"
HI = [{"role": "user", "content": "Hello"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                         "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
CONVERSATIONS = [
    HI,
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "東京の天気は？ 🌧️"}],
    [*HI, {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "Count to three."}],
    [{"role": "user", "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}]}],
]


def post(stack: Stack, path: str, body: dict[str, Any], to: str | None = None) -> httpx.Response:
    return stack.http.post((to or stack.proxy_url) + path, json={"model": SERVED_NAME, **body})


@pytest.mark.parametrize(
    "extra", [{}, {"tools": [TOOL]}, {"add_generation_prompt": False}], ids=["plain", "tools", "no generation prompt"]
)
def test_a_batchs_count_is_what_vllm_charges(stack: Stack, extra: dict[str, Any]) -> None:
    response = post(stack, BATCH, {"messages": CONVERSATIONS, "max_tokens": 2, "temperature": 0, **extra})
    assert response.status_code == 200, response.text
    assert response.headers[GUARD_ACTION] == "pass" and len(response.json()["choices"]) == len(CONVERSATIONS)
    assert int(response.headers[GUARD_PROMPT]) == response.json()["usage"]["prompt_tokens"]


def test_a_batch_is_clamped_for_its_longest_conversation(stack: Stack) -> None:
    longest = sized_chat(stack, MAX_MODEL_LEN - 12)
    request = {"messages": [HI, longest], "max_tokens": 60, "temperature": 0}
    direct = post(stack, BATCH, request, to=stack.vllm_url)
    assert direct.status_code == (400 if stack.version == "0.31.0" else 200)  # 0.31 refuses, 0.32 cuts silently
    mark = stack.recorder.mark()
    response = post(stack, BATCH, request)
    assert response.status_code == 200 and response.headers[GUARD_ACTION] == "clamp"
    assert response.headers[GUARD_MAX] == "12"
    (sent,) = [e for e in stack.recorder.since(mark) if e.target == BATCH]
    assert json.loads(sent.request.body)["max_tokens"] == 12
    usage = response.json()["usage"]
    assert int(response.headers[GUARD_PROMPT]) == usage["prompt_tokens"] and usage["completion_tokens"] == 2 * 12


def test_a_conversation_that_cannot_fit_refuses_the_batch_before_vllm(stack: Stack) -> None:
    before = requests_seen(stack, BATCH)
    response = post(stack, BATCH, {"messages": [HI, [{"role": "user", "content": words(3000)}]], "max_tokens": 5})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "That is conversation 1 (messages[1]) of 2." in error["message"]
    assert requests_seen(stack, BATCH) == before


def test_generates_count_is_what_vllm_charges_and_a_stream_says_it_too(stack: Stack) -> None:
    ids = stack.http.post(stack.vllm_url + "/tokenize", json={"prompt": "東京の天気は？ Hello world"}).json()["tokens"]
    response = post(stack, GENERATE, {"token_ids": ids, "sampling_params": {"max_tokens": 3, "n": 2}})
    assert response.status_code == 200, response.text
    assert response.headers[GUARD_ACTION] == "pass" and response.headers[GUARD_MAX] == "3"
    usage = response.json()["usage"]
    assert int(response.headers[GUARD_PROMPT]) == usage["prompt_tokens"] == len(ids) and usage["completion_tokens"] == 6
    # n = 1: vLLM 0.31's generate stream fails with n > 1 (an IndexError in its own stream generator; 0.32 fixed it)
    stream = {"model": SERVED_NAME, "token_ids": ids, "sampling_params": {"max_tokens": 2}, "stream": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    with stack.http.stream("POST", stack.proxy_url + GENERATE, json=stream) as streamed:
        events = [line for line in streamed.iter_lines() if line.startswith("data: {")]
        prompt = int(streamed.headers[GUARD_PROMPT])
    usage = json.loads(events[-1].removeprefix("data: "))["usage"]
    assert usage["prompt_tokens"] == prompt and usage["completion_tokens"] == 2


def test_generates_limit_is_clamped_in_sampling_params(stack: Stack) -> None:
    ids = [19923] * (MAX_MODEL_LEN - 10)
    mark = stack.recorder.mark()
    sampling = {"max_tokens": 1500, "min_tokens": 20, "temperature": 0}
    response = post(stack, GENERATE, {"token_ids": ids, "sampling_params": sampling})
    assert response.status_code == 200 and response.headers[GUARD_ACTION] == "clamp"
    (sent,) = [e for e in stack.recorder.since(mark) if e.target == GENERATE]
    assert json.loads(sent.request.body)["sampling_params"] == {"max_tokens": 10, "min_tokens": 10, "temperature": 0}
    assert response.json()["usage"]["completion_tokens"] == 10


def test_a_token_prompt_of_the_window_is_refused_before_vllm(stack: Stack) -> None:
    direct = post(stack, GENERATE, {"token_ids": [19923] * MAX_MODEL_LEN, "sampling_params": {}}, to=stack.vllm_url)
    assert direct.status_code == 400 and "The decoder prompt (length 2048)" in direct.text
    before = requests_seen(stack, GENERATE)
    response = post(stack, GENERATE, {"token_ids": [19923] * MAX_MODEL_LEN, "sampling_params": {"max_tokens": 1}})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"
    assert requests_seen(stack, GENERATE) == before

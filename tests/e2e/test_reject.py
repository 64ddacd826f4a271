"""A prompt that leaves no room for output is refused by the guard itself, in OpenAI's error shape, and the
request never reaches vLLM (its own request counters do not move)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.e2e.runtime import MAX_MODEL_LEN
from tests.e2e.stack import Stack
from tests.e2e.wire import (
    CHAT_ROUTE,
    COMPLETIONS_ROUTE,
    GUARD_ACTION,
    GUARD_PROMPT,
    requests_seen,
    sized_chat,
    sized_prompt,
    words,
)

pytestmark = pytest.mark.e2e


def assert_guard_rejection(error: openai.BadRequestError, prompt_tokens: int, param: str) -> None:
    assert error.status_code == 400
    assert error.response.headers[GUARD_ACTION] == "reject"
    assert error.response.headers[GUARD_PROMPT] == str(prompt_tokens)
    assert error.response.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = error.response.json()
    assert list(body) == ["error"]
    assert body["error"]["type"] == "BadRequestError"
    assert body["error"]["param"] == param
    assert body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["message"].startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. "
        f"However, your request has {prompt_tokens} input tokens"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_too_long_chat_is_rejected_without_reaching_vllm(stack: Stack, stream: bool) -> None:
    messages: list[Any] = [{"role": "user", "content": words(3000)}]
    prompt_tokens = stack.tokenize(messages=messages)
    seen = requests_seen(stack, CHAT_ROUTE)
    with pytest.raises(openai.BadRequestError) as caught:
        stack.guarded.chat.completions.create(
            model="tiny", messages=messages, max_tokens=10, temperature=0, stream=stream
        )
    assert_guard_rejection(caught.value, prompt_tokens, "messages")
    assert requests_seen(stack, CHAT_ROUTE) == seen


def test_too_long_completion_is_rejected_without_reaching_vllm(stack: Stack) -> None:
    prompt = words(3000)
    prompt_tokens = stack.tokenize(prompt=prompt)
    seen = requests_seen(stack, COMPLETIONS_ROUTE)
    with pytest.raises(openai.BadRequestError) as caught:
        stack.guarded.completions.create(model="tiny", prompt=prompt, max_tokens=10, temperature=0)
    assert_guard_rejection(caught.value, prompt_tokens, "prompt")
    assert requests_seen(stack, COMPLETIONS_ROUTE) == seen


def test_prompt_of_exactly_the_window_is_rejected(stack: Stack) -> None:
    # vLLM itself answers this with a confusing "max_tokens must be at least 1, got 0"; the guard says why.
    messages = sized_chat(stack, MAX_MODEL_LEN)
    seen = requests_seen(stack, CHAT_ROUTE)
    with pytest.raises(openai.BadRequestError) as caught:
        stack.guarded.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    assert_guard_rejection(caught.value, MAX_MODEL_LEN, "messages")
    assert requests_seen(stack, CHAT_ROUTE) == seen


def test_too_long_prompt_in_a_completion_batch_rejects_the_batch(stack: Stack) -> None:
    prompts = ["Hello world, this is a test.", sized_prompt(stack, MAX_MODEL_LEN + 5)]
    seen = requests_seen(stack, COMPLETIONS_ROUTE)
    with pytest.raises(openai.BadRequestError) as caught:
        stack.guarded.completions.create(model="tiny", prompt=prompts, max_tokens=10, temperature=0)
    assert_guard_rejection(caught.value, MAX_MODEL_LEN + 5, "prompt")
    assert requests_seen(stack, COMPLETIONS_ROUTE) == seen


def test_vllm_rejects_the_same_prompt_when_asked_directly(stack: Stack) -> None:
    """The control: without the guard the prompt does reach vLLM, which refuses it with a message of its own."""
    messages: list[Any] = [{"role": "user", "content": words(3000)}]
    seen = requests_seen(stack, CHAT_ROUTE)
    with pytest.raises(openai.BadRequestError) as caught:
        stack.direct.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    assert "maximum context length is 2048 tokens" in json.dumps(caught.value.body)
    assert requests_seen(stack, CHAT_ROUTE) == seen + 1

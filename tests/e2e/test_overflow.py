"""The reason token-guard exists: prompt + max_tokens over the window is a 400 from vLLM <= 0.31, and the guard
turns it into an answer that fills the window exactly, by lowering the output limit to what is left."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.corpus import LONG_TEXT
from tests.e2e.runtime import MAX_MODEL_LEN
from tests.e2e.stack import Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_MAX, GUARD_PROMPT, sized_chat, sized_prompt

pytestmark = pytest.mark.e2e

# About a thousand tokens of English, code, CJK and emoji; with max_tokens 2000 it overflows by about 950.
LONG: list[Any] = [{"role": "user", "content": LONG_TEXT}]


def test_direct_overflow_depends_on_the_vllm_version(stack: Stack) -> None:
    if stack.version == "0.31.0":
        with pytest.raises(openai.BadRequestError) as caught:
            stack.direct.chat.completions.create(model="tiny", messages=LONG, max_tokens=2000, temperature=0)
        assert "maximum context length is 2048 tokens" in caught.value.message
        assert "you requested 2000 output tokens" in caught.value.message
    else:  # 0.32 clamps by itself
        answer = stack.direct.chat.completions.create(model="tiny", messages=LONG, max_tokens=2000, temperature=0)
        assert answer.usage is not None
        assert answer.usage.total_tokens == MAX_MODEL_LEN
        assert answer.choices[0].finish_reason == "length"


def test_guard_clamps_max_tokens_so_the_answer_fills_the_window(stack: Stack) -> None:
    prompt_tokens = stack.tokenize(messages=LONG)
    raw = stack.guarded.chat.completions.with_raw_response.create(
        model="tiny", messages=LONG, max_tokens=2000, temperature=0
    )
    assert raw.headers[GUARD_ACTION] == "clamp"
    assert raw.headers[GUARD_PROMPT] == str(prompt_tokens)
    assert raw.headers[GUARD_MAX] == str(MAX_MODEL_LEN - prompt_tokens)
    answer = raw.parse()
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == prompt_tokens
    assert answer.usage.prompt_tokens + answer.usage.completion_tokens == MAX_MODEL_LEN
    assert answer.choices[0].finish_reason == "length"


def test_guard_clamps_max_completion_tokens(stack: Stack) -> None:
    messages = sized_chat(stack, 2000)
    raw = stack.guarded.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_completion_tokens=100, temperature=0
    )
    assert (raw.headers[GUARD_ACTION], raw.headers[GUARD_MAX]) == ("clamp", "48")
    answer = raw.parse()
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2000, 48)


def test_guard_gives_the_last_token_of_room(stack: Stack) -> None:
    messages = sized_chat(stack, MAX_MODEL_LEN - 1)
    raw = stack.guarded.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0
    )
    assert (raw.headers[GUARD_ACTION], raw.headers[GUARD_MAX]) == ("clamp", "1")
    answer = raw.parse()
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 1


def test_request_that_fits_passes_with_its_own_limit(stack: Stack) -> None:
    raw = stack.guarded.chat.completions.with_raw_response.create(
        model="tiny", messages=LONG, max_tokens=5, temperature=0
    )
    assert (raw.headers[GUARD_ACTION], raw.headers[GUARD_MAX]) == ("pass", "5")
    answer = raw.parse()
    assert answer.usage is not None
    assert answer.usage.completion_tokens == 5


def test_completion_overflow_is_clamped(stack: Stack) -> None:
    prompt = sized_prompt(stack, 2000)
    raw = stack.guarded.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=100, temperature=0)
    assert (raw.headers[GUARD_ACTION], raw.headers[GUARD_PROMPT], raw.headers[GUARD_MAX]) == ("clamp", "2000", "48")
    answer = raw.parse()
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (2000, 48)


def test_completion_default_of_16_tokens_is_clamped_too(stack: Stack) -> None:
    # vLLM's completions endpoint reserves 16 output tokens when max_tokens is absent, so on 0.31 a prompt
    # 8 tokens short of the window fails without it ever being asked for output.
    prompt = sized_prompt(stack, MAX_MODEL_LEN - 8)
    if stack.version == "0.31.0":
        with pytest.raises(openai.BadRequestError):
            stack.direct.completions.create(model="tiny", prompt=prompt, temperature=0)
    raw = stack.guarded.completions.with_raw_response.create(model="tiny", prompt=prompt, temperature=0)
    assert (raw.headers[GUARD_ACTION], raw.headers[GUARD_MAX]) == ("clamp", "8")
    answer = raw.parse()
    assert answer.usage is not None
    assert answer.usage.total_tokens == MAX_MODEL_LEN

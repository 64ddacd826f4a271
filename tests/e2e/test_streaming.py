"""Streams pass through the guard untouched: the same SSE events, in the same framing, as vLLM sends directly
(only the per-response id and created differ), ending with `data: [DONE]`."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.corpus import LONG_TEXT
from tests.e2e.runtime import MAX_MODEL_LEN
from tests.e2e.stack import Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_MAX, normalise_sse

pytestmark = pytest.mark.e2e

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
USAGE = {"include_usage": {"include_usage": True}, "no-usage": None}


def chat_stream(client: openai.OpenAI, **body: Any) -> tuple[dict[str, str], bytes]:
    with client.chat.completions.with_streaming_response.create(
        model="tiny", stream=True, temperature=0, **body
    ) as response:
        return dict(response.headers), b"".join(response.iter_bytes())


def completion_stream(client: openai.OpenAI, **body: Any) -> tuple[dict[str, str], bytes]:
    with client.completions.with_streaming_response.create(
        model="tiny", stream=True, temperature=0, **body
    ) as response:
        return dict(response.headers), b"".join(response.iter_bytes())


def options(usage: str) -> dict[str, Any]:
    value = USAGE[usage]
    return {} if value is None else {"stream_options": value}


def assert_same_stream(direct: tuple[dict[str, str], bytes], guarded: tuple[dict[str, str], bytes]) -> list[bytes]:
    (direct_headers, direct_body), (guarded_headers, guarded_body) = direct, guarded
    assert guarded_headers["content-type"] == direct_headers["content-type"] == "text/event-stream; charset=utf-8"
    events = normalise_sse(guarded_body)
    assert events == normalise_sse(direct_body)
    assert events[-1] == b"data: [DONE]"
    return events


@pytest.mark.parametrize("usage", USAGE)
def test_chat_stream_is_passed_through_unchanged(stack: Stack, usage: str) -> None:
    body = {"messages": MESSAGES, "max_tokens": 8, **options(usage)}
    guarded = chat_stream(stack.guarded, **body)
    events = assert_same_stream(chat_stream(stack.direct, **body), guarded)
    assert guarded[0][GUARD_ACTION] == "pass"
    assert b'"delta":{"role":"assistant"' in events[0]
    assert (b'"choices":[],"usage":' in events[-2]) is (usage == "include_usage")


@pytest.mark.parametrize("usage", USAGE)
def test_completion_stream_is_passed_through_unchanged(stack: Stack, usage: str) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, **options(usage)}
    guarded = completion_stream(stack.guarded, **body)
    events = assert_same_stream(completion_stream(stack.direct, **body), guarded)
    assert guarded[0][GUARD_ACTION] == "pass"
    assert (b'"choices":[],"usage":' in events[-2]) is (usage == "include_usage")


def test_clamped_stream_equals_vllm_asked_for_what_fits(stack: Stack) -> None:
    """Through the guard, max_tokens 2000 streams exactly what vLLM streams for max_tokens = 2048 - prompt."""
    messages: list[Any] = [{"role": "user", "content": LONG_TEXT}]
    room = MAX_MODEL_LEN - stack.tokenize(messages=messages)
    usage = {"stream_options": {"include_usage": True}}
    guarded = chat_stream(stack.guarded, messages=messages, max_tokens=2000, **usage)
    assert (guarded[0][GUARD_ACTION], guarded[0][GUARD_MAX]) == ("clamp", str(room))
    events = assert_same_stream(chat_stream(stack.direct, messages=messages, max_tokens=room, **usage), guarded)
    assert f'"total_tokens":{MAX_MODEL_LEN},"completion_tokens":{room}'.encode() in events[-2]


def test_sdk_reads_the_guarded_stream(stack: Stack) -> None:
    chunks = list(
        stack.guarded.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert chunks[-1].usage.prompt_tokens == stack.tokenize(messages=MESSAGES)

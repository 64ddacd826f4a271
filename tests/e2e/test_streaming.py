"""Streams pass through the guard untouched. Two proofs:

* the exact bytes: the SSE body the client gets equals, byte for byte, the body vLLM sent the guard (seen by the
  recording relay), and the request vLLM got is the client's own bytes (or, when clamped, the same JSON with only
  the output limit changed);
* the same answer as asking vLLM directly: the same role chunk, text, finish and usage chunk, the same
  `data: ...` framing, ending with `data: [DONE]`. Only the per-response id and created differ, and how tokens are
  grouped into events, which vLLM varies from run to run under load.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.corpus import LONG_TEXT
from tests.e2e.recorder import Exchange
from tests.e2e.runtime import MAX_MODEL_LEN
from tests.e2e.stack import Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_MAX, normalise_sse

pytestmark = pytest.mark.e2e

MESSAGES: list[Any] = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
USAGE = {"include_usage": {"stream_options": {"include_usage": True}}, "no-usage": {}}
SSE = "text/event-stream; charset=utf-8"


@dataclass
class Streamed:
    headers: httpx.Headers
    request: bytes  # as the SDK sent it
    body: bytes


def chat(client: openai.OpenAI) -> Callable[..., AbstractContextManager[Any]]:
    return client.chat.completions.with_streaming_response.create


def completions(client: openai.OpenAI) -> Callable[..., AbstractContextManager[Any]]:
    return client.completions.with_streaming_response.create


def stream(create: Callable[..., AbstractContextManager[Any]], **body: Any) -> Streamed:
    with create(model="tiny", stream=True, temperature=0, **body) as response:
        content = b"".join(response.iter_bytes())
        return Streamed(httpx.Headers(dict(response.headers)), response.http_request.content, content)


def upstream_leg(stack: Stack, mark: dict[int, tuple[int, int]], route: str) -> Exchange:
    (exchange,) = [e for e in stack.recorder.since(mark) if e.target == route]
    return exchange


def answer(body: bytes) -> dict[str, Any]:
    """What a client makes of an SSE body, independent of how the tokens were grouped into events."""
    events = normalise_sse(body)
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(event[len(b"data: ") :]) for event in events[:-1]]
    choices = [chunk["choices"][0] for chunk in chunks if chunk["choices"]]
    last = choices[-1]
    return {
        "first": events[0] if b'"role":"assistant"' in events[0] else None,
        "text": "".join(c.get("text") or c.get("delta", {}).get("content") or "" for c in choices),
        "finish": {k: v for k, v in last.items() if k not in ("text", "delta")},
        "usage": events[-2] if not chunks[-1]["choices"] else None,
        "finished_once": sum(c["finish_reason"] is not None for c in choices) == 1,
    }


@pytest.mark.parametrize("usage", USAGE)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"], ids=["chat", "completions"])
def test_stream_is_relayed_byte_for_byte(stack: Stack, route: str, usage: str) -> None:
    is_chat = route.endswith("chat/completions")
    body = {"messages": MESSAGES} if is_chat else {"prompt": "Once upon a time"}
    mark = stack.recorder.mark()
    guarded = stream((chat if is_chat else completions)(stack.guarded), max_tokens=8, **body, **USAGE[usage])
    upstream = upstream_leg(stack, mark, route)
    assert guarded.headers[GUARD_ACTION] == "pass"
    assert upstream.request.body == guarded.request
    assert upstream.response.headers["content-type"] == guarded.headers["content-type"] == SSE
    assert guarded.body == upstream.response.body
    assert (b'"choices":[],"usage":' in normalise_sse(guarded.body)[-2]) is (usage == "include_usage")


@pytest.mark.parametrize("usage", USAGE)
def test_chat_stream_gives_the_same_answer_as_vllm_directly(stack: Stack, usage: str) -> None:
    body = {"messages": MESSAGES, "max_tokens": 8, **USAGE[usage]}
    guarded, direct = stream(chat(stack.guarded), **body), stream(chat(stack.direct), **body)
    assert guarded.headers["content-type"] == direct.headers["content-type"] == SSE
    assert answer(guarded.body) == answer(direct.body)
    assert answer(guarded.body)["finished_once"]


@pytest.mark.parametrize("usage", USAGE)
def test_completion_stream_gives_the_same_answer_as_vllm_directly(stack: Stack, usage: str) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 8, **USAGE[usage]}
    guarded, direct = stream(completions(stack.guarded), **body), stream(completions(stack.direct), **body)
    assert guarded.headers["content-type"] == direct.headers["content-type"] == SSE
    assert answer(guarded.body) == answer(direct.body)


def test_clamped_stream_changes_only_the_limit(stack: Stack) -> None:
    """max_tokens 2000 through the guard: vLLM is asked for what fits, and streams what it streams directly."""
    messages: list[Any] = [{"role": "user", "content": LONG_TEXT}]
    room = MAX_MODEL_LEN - stack.tokenize(messages=messages)
    usage = USAGE["include_usage"]
    mark = stack.recorder.mark()
    guarded = stream(chat(stack.guarded), messages=messages, max_tokens=2000, **usage)
    upstream = upstream_leg(stack, mark, "/v1/chat/completions")
    assert (guarded.headers[GUARD_ACTION], guarded.headers[GUARD_MAX]) == ("clamp", str(room))
    assert json.loads(upstream.request.body) == {**json.loads(guarded.request), "max_tokens": room}
    assert guarded.body == upstream.response.body
    direct = stream(chat(stack.direct), messages=messages, max_tokens=room, **usage)
    assert answer(guarded.body) == answer(direct.body)
    assert f'"total_tokens":{MAX_MODEL_LEN},"completion_tokens":{room}'.encode() in normalise_sse(guarded.body)[-2]


def test_json_answer_is_relayed_byte_for_byte(stack: Stack) -> None:
    mark = stack.recorder.mark()
    raw = stack.guarded.chat.completions.with_raw_response.create(
        model="tiny", messages=MESSAGES, max_tokens=4, temperature=0
    )
    upstream = upstream_leg(stack, mark, "/v1/chat/completions")
    assert upstream.request.body == raw.http_request.content
    assert raw.content == upstream.response.body


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


def test_guarded_response_has_one_of_each_singleton_header(stack: Stack) -> None:
    with httpx.Client(timeout=120) as http:
        for streamed in (False, True):
            body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "stream": streamed}
            response = http.post(stack.proxy_url + "/v1/chat/completions", json=body)
            for name in ("date", "server", "content-type", "content-length", "transfer-encoding"):
                assert len(response.headers.get_list(name)) <= 1, (name, response.headers.get_list(name))

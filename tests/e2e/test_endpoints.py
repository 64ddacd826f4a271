"""Responses, Anthropic Messages, count_tokens and /invocations against a real vLLM 0.31.0 and 0.32.0, with the real
`openai` and `anthropic` SDKs: the guard's count equals what vLLM charges (`usage.input_tokens`) on a corpus per
endpoint, an output limit over the room left is clamped where vLLM 0.31 alone refuses it, and a prompt that cannot
fit is refused in the endpoint's own error shape without reaching vLLM."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.runtime import MAX_MODEL_LEN
from tests.e2e.stack import Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT, requests_seen, words

pytestmark = pytest.mark.e2e

# vLLM's own token counts for these were recorded in-process (tests/counting/endpoints); here they are charged.
CORPUS = json.loads((Path(__file__).parents[1] / "counting" / "endpoints" / "vllm_counts.json").read_text())
RESPONSES = ["string + instructions", "CJK and emoji", "function call round trip", "reasoning + output + user",
             "partial assistant continued", "developer + system items"]  # fmt: skip
MESSAGES = ["system blocks joined, billing header dropped", "tool use round trip", "thinking + redacted_thinking",
            "CJK and emoji", "inline system message", "tool_result list + parallel calls"]  # fmt: skip
TOOL = {"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
CLAUDE_CODE: dict[str, Any] = {
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=0"},
               {"type": "text", "text": "You are Claude Code. " + words(1900)}],
    "tools": [TOOL], "tool_choice": {"type": "none"},  # "auto" needs a tool parser this vLLM does not run
    "messages": [{"role": "user", "content": "List the files in this repository."}],
}  # fmt: skip


# Prompts that leave a few dozen tokens of room: the clamp is checked against the window without generating much.
NEAR_FULL = words(1990)


def half_room(prompt_tokens: int) -> int:
    """A clamp's output on /v1/messages and Responses by default: half the room the prompt leaves, the other half
    kept for the next turn (policy.next_turn_share_*)."""
    room = MAX_MODEL_LEN - prompt_tokens
    return room - room // 2


GREEDY = {"temperature": 0}  # this anthropic SDK has no temperature parameter; vLLM reads it


def body(endpoint: str, name: str) -> dict[str, Any]:
    """A corpus request without its output limit (each test sets its own)."""
    found: dict[str, Any] = next(c["body"] for c in CORPUS if (c["endpoint"], c["name"]) == (endpoint, name))
    found = {k: v for k, v in found.items() if k != "max_tokens"}
    if found.get("tools"):  # rendered all the same; "auto" would need a tool parser this vLLM does not run
        found = {**found, "tool_choice": "none" if endpoint == "responses" else {"type": "none"}}
    return found


@pytest.fixture
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    # an explicit timeout: the SDK refuses a non-streamed max_tokens as large as Claude Code's without one
    with anthropic.Anthropic(base_url=stack.proxy_url, api_key="x", max_retries=0, timeout=120) as client:
        yield client


@pytest.mark.parametrize("name", RESPONSES)
def test_responses_count_is_what_vllm_charges(stack: Stack, name: str) -> None:
    request = {**body("responses", name), "max_output_tokens": 1, "temperature": 0}
    raw = stack.guarded.responses.with_raw_response.create(**request)
    usage = raw.parse().usage
    assert usage is not None and raw.headers[GUARD_PROMPT] == str(usage.input_tokens)


@pytest.mark.parametrize("name", MESSAGES)
def test_messages_count_is_what_vllm_charges(stack: Stack, claude: anthropic.Anthropic, name: str) -> None:
    raw = claude.messages.with_raw_response.create(**body("messages", name), max_tokens=1, extra_body=GREEDY)
    assert raw.headers[GUARD_PROMPT] == str(raw.parse().usage.input_tokens)
    counted = claude.messages.count_tokens(**body("messages", name))
    assert counted.input_tokens == raw.parse().usage.input_tokens  # answered by the guard, equal to vLLM's charge


def test_responses_clamp_succeeds_where_vllm_alone_refuses(stack: Stack) -> None:
    request: dict[str, Any] = {"model": "tiny", "input": NEAR_FULL, "max_output_tokens": 2000, "temperature": 0}
    if stack.version == "0.31.0":
        with pytest.raises(openai.BadRequestError, match="maximum context length is 2048"):
            stack.direct.responses.create(**request)
    raw = stack.guarded.responses.with_raw_response.create(**request)
    usage = raw.parse().usage
    assert raw.headers[GUARD_ACTION] == "clamp" and usage is not None
    assert raw.headers[GUARD_PROMPT] == str(usage.input_tokens)
    assert usage.output_tokens == half_room(usage.input_tokens)  # the other half kept for the next turn


def test_responses_stream_is_clamped(stack: Stack) -> None:
    events = list(stack.guarded.responses.create(model="tiny", input=NEAR_FULL, max_output_tokens=100_000,
                                                 temperature=0, stream=True))  # fmt: skip
    # it ran out of output tokens: 0.31 and 0.32 end with response.completed (status "incomplete"), 0.33 on say so
    assert events[-1].type == ("response.completed" if stack.version < "0.33" else "response.incomplete")
    assert events[-1].response.status == "incomplete"
    usage = events[-1].response.usage
    assert usage is not None and usage.output_tokens == half_room(usage.input_tokens)


def test_claude_code_request_is_clamped_and_streams(stack: Stack, claude: anthropic.Anthropic) -> None:
    direct = anthropic.Anthropic(base_url=stack.vllm_url, api_key="x", max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError, match="cannot be greater than max_model_len"):
        direct.messages.create(model="tiny", max_tokens=32000, **CLAUDE_CODE)  # both versions refuse it
    with claude.messages.stream(model="tiny", max_tokens=32000, extra_body=GREEDY, **CLAUDE_CODE) as stream:
        assert stream.response.headers[GUARD_ACTION] == "clamp"
        prompt = int(stream.response.headers[GUARD_PROMPT])
        final = stream.get_final_message()
    assert final.usage.input_tokens == prompt  # the billing header counted as vLLM counts it (0.32 strips it)
    assert final.usage.output_tokens == half_room(final.usage.input_tokens)


def test_overflow_is_refused_in_each_endpoints_shape_and_never_reaches_vllm(
    stack: Stack, claude: anthropic.Anthropic
) -> None:
    long = words(3000)
    seen = requests_seen(stack, "/v1/responses"), requests_seen(stack, "/v1/messages")
    with pytest.raises(openai.BadRequestError) as responses:
        stack.guarded.responses.create(model="tiny", input=long, max_output_tokens=10)
    assert responses.value.response.headers[GUARD_ACTION] == "reject"
    assert responses.value.code == "context_length_exceeded" and responses.value.param == "input"
    with pytest.raises(anthropic.BadRequestError) as messages:
        claude.messages.create(model="tiny", max_tokens=10, messages=[{"role": "user", "content": long}])
    error = messages.value.body
    vocabulary = "BadRequestError" if stack.version < "0.33" else "invalid_request_error"  # as vLLM's own, by release
    assert isinstance(error, dict) and error["type"] == "error" and error["error"]["type"] == vocabulary
    assert "maximum context length is 2048" in error["error"]["message"]
    assert (requests_seen(stack, "/v1/responses"), requests_seen(stack, "/v1/messages")) == seen


def test_invocations_are_guarded_as_chat(stack: Stack) -> None:
    request = {"model": "tiny", "messages": [{"role": "user", "content": NEAR_FULL}], "max_tokens": 2000}
    answer = httpx.post(stack.proxy_url + "/invocations", json={**request, "temperature": 0}, timeout=120)
    assert answer.status_code == 200 and answer.headers[GUARD_ACTION] == "clamp"
    assert answer.json()["usage"]["total_tokens"] == MAX_MODEL_LEN

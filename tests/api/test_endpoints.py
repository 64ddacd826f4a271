"""The wire models of the Responses, Anthropic Messages and /invocations requests: what they read, what they refuse,
and that every other field stays in the body untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.anthropic import parse_messages
from proxy.api.invocations import NO_HANDLER, NO_PROMPT, invocation_kind
from proxy.api.responses import parse_responses
from proxy.errors import InvalidRequest


def raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def test_responses_reads_its_limit_and_keeps_the_rest() -> None:
    req = parse_responses(raw({"input": "hi", "max_output_tokens": 7, "store": False, "x_future": [1]}))
    assert req.requested_output == ("max_output_tokens", 7)
    assert req.body["x_future"] == [1] and req.input == "hi"
    assert not req.truncation_auto and req.previous_response_id is None


def test_responses_flags_what_the_count_cannot_see() -> None:
    req = parse_responses(raw({"input": [], "previous_response_id": "resp_1", "truncation": "auto"}))
    assert req.previous_response_id == "resp_1" and req.truncation_auto


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": 5}, "input"),
        ({"input": ["text"]}, "input"),
        ({"input": "x", "max_output_tokens": "10"}, "max_output_tokens"),
        ({"input": "x", "instructions": ["a"]}, "instructions"),
    ],
)
def test_responses_refuses_fields_it_cannot_read(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_responses(raw(body))
    assert caught.value.param == param


def test_messages_requires_max_tokens_but_count_tokens_does_not() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest) as caught:
        parse_messages(raw(body))
    assert caught.value.param == "max_tokens"
    assert parse_messages(raw(body), count_only=True).max_tokens is None
    assert parse_messages(raw({**body, "max_tokens": 32000})).requested_output == ("max_tokens", 32000)


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
        {"max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]},
        {"max_tokens": 5, "messages": [], "system": 3},
        {"max_tokens": 5, "messages": [], "tools": [{"name": "t"}]},
        {"max_tokens": 10, "messages": [], "thinking": {"type": "enabled", "budget_tokens": 10}},
    ],
)
def test_messages_refuses_what_vllms_request_model_refuses(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        parse_messages(raw(body))


@pytest.mark.parametrize(
    "body,kind",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "chat"),
        ({"prompt": [[1, 2], [3]]}, "completion"),
    ],
)
def test_invocations_dispatch_like_vllm(body: dict[str, Any], kind: str) -> None:
    assert invocation_kind(body) == kind


@pytest.mark.parametrize(
    "body,message", [({}, NO_PROMPT), ({"prompt": ""}, NO_PROMPT), ({"prompt": {"a": 1}}, NO_HANDLER)]
)
def test_invocations_without_a_handler_get_vllms_400(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        invocation_kind(body)
    assert caught.value.message == message

"""A body's number of values is bounded before json.loads builds any (server.max_json_values): the count is exact,
strings do not count, and JSON held in tool calls' `arguments` strings, which the guard parses too, is bounded with
it. Integers too long for Python's int() are a 400 as well, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.api.body import json_arguments, parse_json_object
from proxy.api.shape import check_shape
from proxy.errors import InvalidRequest


def counted(value: Any) -> int:
    """What the bound counts: one per array item and object member, plus one per empty array or object."""
    if isinstance(value, list):
        return (len(value) or 1) + sum(map(counted, value))
    if isinstance(value, dict):
        return (len(value) or 1) + sum(map(counted, value.values()))
    return 0


def refused(raw: bytes, max_values: int) -> bool:
    try:
        check_shape(raw, max_depth=1000, max_values=max_values)
    except InvalidRequest as exc:
        assert "(server.max_json_values)" in exc.message
        return True
    return False


json_values = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}",\\ ax', max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}",\\a', max_size=3), inner),
    max_leaves=40,
)


@given(json_values)
def test_the_values_bound_is_exact(value: Any) -> None:
    raw = json.dumps(value).encode()
    values = counted(value)
    assert not refused(raw, values)
    assert values == 0 or refused(raw, values - 1)


def test_brackets_and_commas_inside_strings_do_not_count() -> None:
    text = '[{,\\",[]' * 1000
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    assert parse_json_object(raw, max_values=1024)["messages"][0]["content"] == text


def test_more_values_than_the_limit_is_a_400_that_names_the_setting() -> None:
    raw = b'{"model": "m", "unused": [' + b",".join([b"[]"] * 2000) + b"]}"
    with pytest.raises(InvalidRequest) as refusal:
        parse_json_object(raw, max_values=1024)
    assert refusal.value.message == (
        "The request body holds 4002 JSON values; at most 1024 are accepted (server.max_json_values)."
    )
    assert refusal.value.status == 400 and refusal.value.param is None
    assert len(parse_json_object(raw, max_values=4002)["unused"]) == 2000


def chat_with_arguments(arguments: str) -> bytes:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    return json.dumps({"model": "m", "messages": messages}).encode()


def test_json_in_tool_call_arguments_is_bounded_too() -> None:
    many = json.dumps({"a": [[] for _ in range(600)]})  # 1,201 values, inside a string of the body
    with pytest.raises(InvalidRequest, match=r"tool calls' arguments .* hold 1201 JSON values; at most 1024 .*"
                                             r"\(server.max_json_values\)"):  # fmt: skip
        parse_json_object(chat_with_arguments(many), max_values=1024)
    fewer = json.dumps({"a": [[] for _ in range(500)]})
    body = parse_json_object(chat_with_arguments(fewer), max_values=1024)
    assert json_arguments(body["messages"][1]["tool_calls"][0]["function"]["arguments"]) == json.loads(fewer)


def test_responses_function_call_arguments_are_bounded_too() -> None:
    item = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": json.dumps(list(range(2000)))}
    raw = json.dumps({"model": "m", "input": [item]}).encode()
    with pytest.raises(InvalidRequest, match="tool calls' arguments"):
        parse_json_object(raw, max_values=1024)


@pytest.mark.parametrize("digits", [4301, 100_000])
def test_an_integer_longer_than_python_reads_is_a_400(digits: int) -> None:
    raw = b'{"model": "m", "max_tokens": 1' + b"0" * (digits - 1) + b"}"
    with pytest.raises(InvalidRequest, match="an integer of more than 4300 digits"):
        parse_json_object(raw)
    assert parse_json_object(b'{"max_tokens": 1' + b"0" * 4299 + b"}")["max_tokens"] == 10**4299


@pytest.mark.parametrize(
    "arguments", ['{"a": 1', '{"a": 1' + "0" * 5000 + "}", "[" * 100_000 + "]" * 100_000, "[1, 2]", "3"]
)
def test_tool_call_arguments_that_cannot_be_read_as_an_object_are_none_or_not_a_dict(arguments: str) -> None:
    assert not isinstance(json_arguments(arguments), dict)

"""Pathological JSON is a clear 400 before it is parsed: the nesting limit is exact, strings inside do not count,
and the number of messages is bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.api.body import parse_json_object
from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.api.shape import check_shape
from proxy.errors import InvalidRequest


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@pytest.mark.parametrize("depth", [1, 7, 8, 9, 64, 65])
def test_depth_limit_is_exact(depth: int) -> None:
    raw = json.dumps({"a": nested(depth - 1)}).encode()
    if depth > 8:
        with pytest.raises(InvalidRequest, match="more than 8 levels"):
            parse_json_object(raw, max_depth=8)
    else:
        assert parse_json_object(raw, max_depth=8)["a"] == nested(depth - 1)
    assert (depth <= 64) == _passes(raw, 64)


def _passes(raw: bytes, max_depth: int) -> bool:
    try:
        check_shape(raw, max_depth, max_values=len(raw))
    except InvalidRequest:
        return False
    return True


def test_brackets_inside_strings_do_not_count() -> None:
    tricky = ["[[[[[[[[[[", "{{{{{{{{{{", '\\"[[[[[[[[[[', "\\\\", '"]]]]]]]]]]"', '\\\\\\"[[[[[[[[']
    raw = json.dumps({"messages": [{"role": "user", "content": t} for t in tricky]}).encode()
    assert parse_chat(raw, max_depth=3).messages[0]["content"] == tricky[0]
    assert parse_completion(json.dumps({"prompt": "[" * 1000}).encode(), max_depth=2).prompts == ["[" * 1000]


json_values = st.recursive(
    st.none() | st.integers() | st.text(alphabet='[]{}"\\ ax', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=3), inner),
    max_leaves=30,
)


@given(json_values, st.integers(min_value=1, max_value=10))
def test_depth_check_agrees_with_the_parsed_depth(value: Any, max_depth: int) -> None:
    assert _passes(json.dumps(value).encode(), max_depth) == (depth_of(value) <= max_depth)


def test_message_count_limit() -> None:
    raw = json.dumps({"messages": [{"role": "user", "content": "x"}] * 5}).encode()
    assert len(parse_chat(raw, max_messages=5).messages) == 5
    with pytest.raises(InvalidRequest, match="at most 4 are accepted") as info:
        parse_chat(raw, max_messages=4)
    assert info.value.param == "messages"

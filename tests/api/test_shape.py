"""A body's number of values is bounded before json.loads builds any (server.max_json_values): the count is exact,
and strings do not count. Integers too long for Python's int() are a 400 as well, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.api.body import parse_json_object
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


@pytest.mark.parametrize("digits", [4301, 100_000])
def test_an_integer_longer_than_python_reads_is_a_400(digits: int) -> None:
    raw = b'{"model": "m", "max_tokens": 1' + b"0" * (digits - 1) + b"}"
    with pytest.raises(InvalidRequest, match="an integer of more than 4300 digits"):
        parse_json_object(raw)
    assert parse_json_object(b'{"max_tokens": 1' + b"0" * 4299 + b"}")["max_tokens"] == 10**4299

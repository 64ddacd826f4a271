"""Reading any request body: one JSON object, bounded nesting, and a rewrite that changes only the given fields."""

from __future__ import annotations

import json

import pytest

from proxy.api.body import with_changes
from proxy.api.chat import parse_chat
from proxy.errors import InvalidRequest

OK_MESSAGES = [{"role": "user", "content": "hi"}]


def test_deeply_nested_json_is_a_clear_400() -> None:
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        parse_chat(b"[" * 100_000 + b"]" * 100_000)


def test_rewrite_changes_only_the_given_fields_and_keeps_key_order() -> None:
    body = {"model": "m", "max_tokens": 9000, "messages": OK_MESSAGES, "extra_field": {"ü": [1, None]}}
    rewritten = json.loads(with_changes(body, {"max_tokens": 100}))
    assert list(rewritten) == list(body)
    assert rewritten == {**body, "max_tokens": 100}
    assert "ü".encode() in with_changes(body, {})

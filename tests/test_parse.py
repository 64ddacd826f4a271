"""Reading request bodies: each malformed input gets a clear 400 that names the field."""

from __future__ import annotations

import json

import pytest

from proxy.api.body import with_changes
from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.errors import InvalidRequest

OK_MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "raw,param,fragment",
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be a JSON object"),
        (b'"text"', None, "must be a JSON object"),
        (json.dumps({"messages": "hi"}).encode(), "messages", "non-empty array"),
        (json.dumps({"messages": []}).encode(), "messages", "non-empty array"),
        (json.dumps({"messages": [{"content": "x"}]}).encode(), "messages", "string 'role'"),
        (json.dumps({"messages": OK_MESSAGES, "max_tokens": "10"}).encode(), "max_tokens", "must be an integer"),
        (json.dumps({"messages": OK_MESSAGES, "max_tokens": 1.5}).encode(), "max_tokens", "must be an integer"),
        (json.dumps({"messages": OK_MESSAGES, "max_tokens": True}).encode(), "max_tokens", "must be an integer"),
        (json.dumps({"messages": OK_MESSAGES, "max_tokens": -1}).encode(), "max_tokens", "at least 0"),
        (json.dumps({"messages": OK_MESSAGES, "max_completion_tokens": {}}).encode(), "max_completion_tokens", ""),
        (json.dumps({"messages": OK_MESSAGES, "n": "2"}).encode(), "n", "must be an integer"),
        (json.dumps({"messages": OK_MESSAGES, "stream": "yes"}).encode(), "stream", "must be a boolean"),
        (json.dumps({"messages": OK_MESSAGES, "model": 5}).encode(), "model", "must be a string"),
        (json.dumps({"messages": OK_MESSAGES, "tools": {}}).encode(), "tools", "must be an array"),
        (json.dumps({"messages": OK_MESSAGES, "continue_final_message": True}).encode(), "continue_final_message", ""),
    ],
)
def test_bad_chat_bodies(raw: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(raw)
    assert info.value.status == 400 and info.value.param == param
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "prompt,fragment",
    [(None, "must be a string"), (5, "must be a string"), ([], "at least one prompt"), ([[]], "at least one prompt"),
     (["a", [1]], "cannot be mixed"), ([1, "a"], "cannot be mixed"), ([-1], "cannot be mixed"), ([True], "mixed")],
)  # fmt: skip
def test_bad_completion_prompts(prompt: object, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_completion(json.dumps({"prompt": prompt}).encode())
    assert info.value.param == "prompt" and fragment in info.value.message


def test_deeply_nested_json_is_a_clear_400() -> None:
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        parse_chat(b"[" * 100_000 + b"]" * 100_000)


def test_prompt_forms() -> None:
    assert parse_completion(b'{"prompt": "a"}').prompts == ["a"]
    assert parse_completion(b'{"prompt": ["a", "b"]}').prompts == ["a", "b"]
    assert parse_completion(b'{"prompt": [1, 2]}').prompts == [[1, 2]]
    assert parse_completion(b'{"prompt": [[1], [2, 3]]}').prompts == [[1], [2, 3]]


def test_rewrite_changes_only_the_given_fields_and_keeps_key_order() -> None:
    body = {"model": "m", "max_tokens": 9000, "messages": OK_MESSAGES, "extra_field": {"ü": [1, None]}}
    rewritten = json.loads(with_changes(body, {"max_tokens": 100}))
    assert list(rewritten) == list(body)
    assert rewritten == {**body, "max_tokens": 100}
    assert "ü".encode() in with_changes(body, {})

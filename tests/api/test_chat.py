"""Reading a chat request: every malformed body is a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from proxy.api.chat import parse_chat, transferred_prompt
from proxy.errors import InvalidRequest

OK_MESSAGES = [{"role": "user", "content": "hi"}]


BOTH_FLAGS = {"continue_final_message": True, "add_generation_prompt": True}  # both sent: vLLM's validator refuses


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
        (
            json.dumps({"messages": OK_MESSAGES, **BOTH_FLAGS}).encode(),
            "continue_final_message",
            "",
        ),
    ],
)
def test_bad_chat_bodies(raw: bytes, param: str | None, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_chat(raw)
    assert info.value.status == 400 and info.value.param == param
    assert fragment in info.value.message


@pytest.mark.parametrize(
    "transfer,ids",
    [(None, None), ({"do_remote_prefill": True}, None), ({"prompt_token_ids": None}, None),
     ({"prompt_token_ids": [5, 6, 7]}, 3)],
)  # fmt: skip
def test_transferred_prompt_ids_are_what_vllm_runs(transfer: object, ids: int | None) -> None:
    assert transferred_prompt({"messages": [], "kv_transfer_params": transfer}) == ids


@pytest.mark.parametrize("bad", [[], "1 2", [1, -2], [1, True], [[1]], 7])
def test_transferred_ids_vllm_refuses_are_refused(bad: object) -> None:
    with pytest.raises(InvalidRequest) as info:
        transferred_prompt({"kv_transfer_params": {"prompt_token_ids": bad}})
    assert info.value.param == "kv_transfer_params.prompt_token_ids"

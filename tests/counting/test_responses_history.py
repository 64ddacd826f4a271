"""A Responses input history becomes the chat messages vLLM builds from it, by the upstream's release: 0.34 fills in
what an OpenResponses item leaves out and converts what 0.33 fails on or passes through (an output message without
content, reasoning and assistant items that stay dicts); in front of 0.33 and earlier the guard keeps their reading,
and refuses with a 400 what they answer with a 500 (tests/support/responses_history.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.responses import parse_responses
from proxy.counting.responses import responses_chat
from proxy.errors import InvalidRequest
from tests.support.responses_history import FAILS, HISTORIES, REFUSED, History

CASES = [(h, fills) for h in HISTORIES for fills in (False, True)]


def _messages(items: list[dict[str, Any]], fills: bool) -> list[dict[str, Any]]:
    req = parse_responses(json.dumps({"model": "m", "input": items}).encode())
    return responses_chat(req, True, fills=fills).messages


@pytest.mark.parametrize("history,fills", CASES, ids=[f"{h.name} ({'0.34' if f else '0.33'})" for h, f in CASES])
def test_history_becomes_vllms_messages(history: History, fills: bool) -> None:
    expected = history.since if fills else history.before
    if expected in (REFUSED, FAILS):
        with pytest.raises(InvalidRequest) as refused:
            _messages(history.items, fills)
        assert refused.value.param == "input"
    else:
        assert _messages(history.items, fills) == expected


def test_a_reasoning_dict_is_refused_before_034_with_vllms_text() -> None:
    item = {"type": "reasoning", "summary": {}, "content": [{"type": "reasoning_text", "text": "Think."}]}
    with pytest.raises(InvalidRequest) as refused:
        _messages([item], fills=False)
    assert refused.value.message == "Unsupported input item type: reasoning (parameter=input)"


def test_034_reads_an_encrypted_reasoning_dict_and_refuses_an_encrypted_item() -> None:
    """0.34 checks encrypted_content on ResponseReasoningItem only: a dict's is never read."""
    assert _messages([{"type": "reasoning", "summary": {}, "encrypted_content": "x"}], fills=True) == [
        {"role": "assistant", "reasoning": ""}
    ]
    with pytest.raises(InvalidRequest) as refused:
        _messages([{"type": "reasoning", "summary": [], "encrypted_content": "x"}], fills=True)
    assert refused.value.message == "Encrypted content is not supported. (parameter=input)"


@pytest.mark.parametrize("fills", [False, True])
def test_an_unfinished_assistant_item_without_a_type_is_continued_from_034(fills: bool) -> None:
    item = {"role": "assistant", "content": [{"type": "output_text", "text": "It is"}], "status": "in_progress"}
    if not fills:
        with pytest.raises(InvalidRequest):
            _messages([item], fills)
        return
    req = parse_responses(json.dumps({"model": "m", "input": [item]}).encode())
    chat = responses_chat(req, True, fills=True)
    assert chat.messages == [{"role": "assistant", "content": "It is"}] and chat.continue_final_message

"""gpt-oss Responses input histories as vLLM 0.33 and 0.34 render them (tests/support/harmony_history.py): the
guard's harmony messages for each, by the upstream's release, are those vLLM's own functions build from the
release's source (tests/support/vllm_harmony_input.py; skipped where the source is not on the machine)."""

from __future__ import annotations

import json
from typing import Any

import openai_harmony as oh
import pytest

from proxy.api.responses import parse_responses
from proxy.counting.harmony import HarmonyChat
from proxy.counting.harmony_responses import harmony_chat
from proxy.errors import InvalidRequest
from tests.support import vllm_harmony_input
from tests.support.harmony_history import HISTORIES, REFUSED, HarmonyHistory, rendered

CASES = [(h, release) for h in HISTORIES for release in ("0.33", "0.34")]
IDS = [f"{h.name} ({release})" for h, release in CASES]


@pytest.fixture(scope="module")
def native() -> HarmonyChat:
    return HarmonyChat()


def guard_messages(native: HarmonyChat, items: list[dict[str, Any]], release: str) -> list[dict[str, Any]] | str:
    """The guard's harmony messages after the preamble (a system message alone: no instructions, no tools)."""
    req = parse_responses(json.dumps({"model": "gpt-oss", "input": items}).encode())
    try:
        chat = harmony_chat(native, req, True, None, fills=release == "0.34")
    except InvalidRequest as refused:
        assert refused.param == "input"
        return REFUSED
    assert chat.harmony is not None and chat.harmony[0]["role"] == "system"
    return [json.loads(oh.Message.from_dict(m).to_json()) for m in chat.harmony[1:]]


def vllm_messages(items: list[dict[str, Any]], release: str) -> list[dict[str, Any]] | str:
    if not vllm_harmony_input.source(release).is_dir():
        pytest.skip(f"vLLM {release}'s source is not on this machine")
    read = vllm_harmony_input.reader(release)(items)
    if isinstance(read, str):
        return REFUSED  # a 500 (FAILS) the guard refuses with a 400 too
    return [json.loads(m.to_json()) for m in read]


def expected(history: HarmonyHistory, release: str) -> Any:
    return history.since if release == "0.34" else history.before


def summed(messages: list[dict[str, Any]] | str) -> Any:
    return messages if isinstance(messages, str) else rendered(messages)


@pytest.mark.parametrize("history,release", CASES, ids=IDS)
def test_the_guard_renders_what_the_release_renders(native: HarmonyChat, history: HarmonyHistory, release: str) -> None:
    assert summed(guard_messages(native, history.items, release)) == expected(history, release)


@pytest.mark.parametrize("history,release", CASES, ids=IDS)
def test_the_history_is_what_vllms_own_functions_build(history: HarmonyHistory, release: str) -> None:
    assert summed(vllm_messages(history.items, release)) == expected(history, release)


@pytest.mark.parametrize("history,release", CASES, ids=IDS)
def test_the_guards_messages_are_vllms_exactly(native: HarmonyChat, history: HarmonyHistory, release: str) -> None:
    assert guard_messages(native, history.items, release) == vllm_messages(history.items, release)

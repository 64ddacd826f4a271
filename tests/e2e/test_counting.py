"""The guard counts every prompt of the parity corpus exactly like the real vLLM: its header equals vLLM's own
`POST /tokenize` count and the `usage.prompt_tokens` of the answer; and answers the render routes itself
(render.local) with vLLM's own render answer, token id for token id."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.corpus import CHAT_CASES, COMPLETION_PROMPTS
from tests.e2e.render_parity import answers, comparable
from tests.e2e.stack import Stack
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT

pytestmark = pytest.mark.e2e

TEMPLATE_FLAGS = ("add_generation_prompt", "continue_final_message")


@pytest.mark.parametrize("fields", [fields for _, fields in CHAT_CASES], ids=[case for case, _ in CHAT_CASES])
def test_chat_count_matches_vllm(stack: Stack, fields: dict[str, Any]) -> None:
    expected = stack.tokenize(**fields)
    tools = fields.get("tools")
    raw = stack.guarded.chat.completions.with_raw_response.create(
        model="tiny",
        messages=fields["messages"],
        tools=tools if tools else openai.omit,
        # "auto" needs a tool parser that this vLLM does not run; "none" still renders the tools.
        tool_choice="none" if tools else openai.omit,
        max_tokens=1,
        temperature=0,
        extra_body={flag: fields[flag] for flag in TEMPLATE_FLAGS if flag in fields},
    )
    assert raw.headers[GUARD_PROMPT] == str(expected)
    assert raw.headers[GUARD_ACTION] == "pass"
    answer = raw.parse()
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == expected


@pytest.mark.parametrize(
    "prompt", [text for _, text in COMPLETION_PROMPTS], ids=[case for case, _ in COMPLETION_PROMPTS]
)
def test_completion_count_matches_vllm(stack: Stack, prompt: str) -> None:
    expected = stack.tokenize(prompt=prompt)
    raw = stack.guarded.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
    assert raw.headers[GUARD_PROMPT] == str(expected)
    answer = raw.parse()
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == expected


def _render_pair(stack: Stack, path: str, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    """The guard's render answer and vLLM's, each as its items, compared as render_parity.py says."""
    guarded = stack.http.post(stack.proxy_url + path, json=body)
    direct = stack.http.post(stack.vllm_url + path, json=body)
    assert guarded.status_code == direct.status_code == 200, guarded.text
    assert guarded.headers["x-token-guard-render"] == "local"
    return answers(guarded.json()), answers(direct.json())


@pytest.mark.parametrize("fields", [fields for _, fields in CHAT_CASES], ids=[case for case, _ in CHAT_CASES])
def test_chat_render_answer_is_vllms(stack: Stack, fields: dict[str, Any]) -> None:
    body = {"model": "tiny", **fields, "max_tokens": 1, "temperature": 0}
    if fields.get("tools"):
        body["tool_choice"] = "none"
    (ours,), (theirs,) = _render_pair(stack, "/v1/chat/completions/render", body)
    assert ours["token_ids"] == theirs["token_ids"] and len(ours["token_ids"]) == stack.tokenize(**fields)
    differ = {key: (value, comparable(ours).get(key)) for key, value in comparable(theirs).items()
              if comparable(ours).get(key) != value}  # fmt: skip
    assert comparable(ours) == comparable(theirs), differ


def test_completion_render_answers_are_vllms(stack: Stack) -> None:
    body = {"model": "tiny", "prompt": [text for _, text in COMPLETION_PROMPTS], "max_tokens": 3}
    ours, theirs = _render_pair(stack, "/v1/completions/render", body)
    assert [a["token_ids"] for a in ours] == [a["token_ids"] for a in theirs]
    assert [comparable(a) for a in ours] == [comparable(a) for a in theirs]

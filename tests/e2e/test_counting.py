"""The guard counts every prompt of the parity corpus exactly like the real vLLM: its header equals vLLM's own
`POST /tokenize` count and the `usage.prompt_tokens` of the answer."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.corpus import CHAT_CASES, COMPLETION_PROMPTS
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

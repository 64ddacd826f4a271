"""The reference count the guard is judged against: vLLM's conversation and tools (developer messages mapped to
system for templates that never name the role), then transformers' own apply_chat_template(tokenize=True)."""

from __future__ import annotations

from typing import Any

from proxy.counting.conversation import detect_content_format, to_conversation, to_tools
from proxy.counting.roles import developer_as_system, has_developer, mentions_developer


def reference_chat_count(ref: Any, case: dict[str, Any]) -> int:
    conversation = to_conversation(case["messages"], detect_content_format(ref.chat_template))
    if has_developer(conversation) and not mentions_developer(ref.chat_template):
        conversation = developer_as_system(conversation)
    ids = ref.apply_chat_template(
        conversation,
        tools=to_tools(case.get("tools")),  # vLLM re-serializes tools; the simulator's tests check that step
        tokenize=True,
        return_dict=True,
        add_generation_prompt=case.get("add_generation_prompt", True),
        continue_final_message=case.get("continue_final_message", False),
    )["input_ids"]
    return len(ids)

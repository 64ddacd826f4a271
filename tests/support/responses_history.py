"""Responses input histories and the chat messages vLLM 0.33 and 0.34 build from them (or how they refuse them),
read from `responses/protocol.py` (input_item_parsing; 0.34's _normalize_openresponses_input_item) and
`responses/utils.py` (_construct_message_from_response_item) of each release, and checked once by running those
functions on the SDK's types. Each history hits one branch 0.34 changed; the guard's and the simulator's readers are
both held to it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'}
RESULT = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}
TOOL = {"role": "tool", "content": "Sunny, 21 C", "tool_call_id": "call_1"}
CHAT_CALL = {"id": "call_1", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}, "type": "function"}
REFUSED = "refused"  # vLLM answers 400 (its own text, or pydantic's)
FAILS = "fails"  # vLLM answers 500 (an exception it does not catch); the guard refuses it with a 400 instead


def text(kind: str, value: str) -> dict[str, str]:
    return {"type": kind, "text": value}


@dataclass(frozen=True)
class History:
    name: str
    items: list[dict[str, Any]]
    before: list[Message] | str  # what 0.31-0.33 build, or REFUSED / FAILS
    since: list[Message] | str  # what 0.34 builds


HISTORIES = [
    History(
        "an output message without content after a call",
        [USER, CALL, {"type": "message", "role": "assistant", "content": []}, RESULT],
        FAILS,  # item.content[0].text: IndexError
        [USER, {"role": "assistant", "tool_calls": [CHAT_CALL], "content": ""}, TOOL],
    ),
    History(
        "an output message without content, alone",
        [USER, {"type": "message", "role": "assistant", "content": []}, {"role": "user", "content": "And Rome?"}],
        FAILS,
        [USER, {"role": "assistant", "content": ""}, {"role": "user", "content": "And Rome?"}],
    ),
    History(
        "an assistant item without a type, with output parts",
        [USER, {"role": "assistant", "content": [text("output_text", "Sunny."), text("output_text", "Warm.")]}],
        REFUSED,  # fits no SDK type until 0.34 stamps type "message" on it
        [USER, {"role": "assistant", "content": "Sunny."}],
    ),
    History(
        "an assistant item without a type or content",
        [USER, {"role": "assistant", "content": []}, RESULT],
        [USER, {"role": "assistant", "content": []}, TOOL],  # 0.33: the message as it is
        [USER, {"role": "assistant", "content": ""}, TOOL],
    ),
    History(
        "a reasoning item without a summary, then its answer",
        [USER, {"type": "reasoning", "content": [text("reasoning_text", "Look it up.")]}, CALL, RESULT],
        REFUSED,  # ResponseReasoningItem needs a summary
        [USER, {"role": "assistant", "reasoning": "Look it up.", "tool_calls": [CHAT_CALL]}, TOOL],
    ),
    History(
        "a reasoning dict: content an object, the summary not read",
        [USER, {"type": "reasoning", "summary": [text("summary_text", "s")], "content": {}}, CALL, RESULT],
        REFUSED,  # "Unsupported input item type: reasoning"
        [USER, {"role": "assistant", "reasoning": "", "tool_calls": [CHAT_CALL]}, TOOL],
    ),
    History(
        "a reasoning dict: untyped summary parts, content read",
        [
            USER,
            {"type": "reasoning", "summary": [{"text": "s"}], "content": [text("reasoning_text", "Think.")]},
            {"type": "message", "role": "assistant", "content": [text("output_text", "Sunny.")]},
        ],
        REFUSED,
        [USER, {"role": "assistant", "reasoning": "Think.", "content": "Sunny."}],
    ),
    History(
        "a reasoning dict joining the assistant message before it",
        [
            USER,
            {"role": "assistant", "content": "Let me see."},
            {"type": "reasoning", "summary": "", "content": [text("reasoning_text", "Think.")]},
            CALL,
            RESULT,
        ],
        REFUSED,
        [USER, {"role": "assistant", "content": "Let me see.", "reasoning": "Think.", "tool_calls": [CHAT_CALL]}, TOOL],
    ),
    History(
        "a reasoning dict whose summary parts are untyped",
        [USER, {"type": "reasoning", "summary": [{"text": "s"}]}],
        REFUSED,
        REFUSED,  # listing the summary validates its parts: pydantic's ValidationError, a 400
    ),
    History(
        "an assistant dict whose first part has no text",
        [
            USER,
            CALL,
            {
                "role": "assistant",
                "content": [{"type": "input_file", "file_id": "file-1"}, text("input_text", "Sunny.")],
            },
            RESULT,
        ],
        [
            USER,
            {"role": "assistant", "tool_calls": [CHAT_CALL]},
            {
                "role": "assistant",
                "content": [{"type": "input_file", "file_id": "file-1"}, text("input_text", "Sunny.")],
            },
            TOOL,
        ],  # 0.33: the message as it is, after the call's
        [USER, {"role": "assistant", "tool_calls": [CHAT_CALL], "content": ""}, TOOL],
    ),
    History(
        "an assistant dict with input text, after a call",
        [USER, CALL, {"role": "assistant", "content": [text("input_text", "Sunny."), text("input_text", "Warm.")]}],
        [USER, {"role": "assistant", "tool_calls": [CHAT_CALL], "content": "Sunny."}],
        [USER, {"role": "assistant", "tool_calls": [CHAT_CALL], "content": "Sunny."}],
    ),
    History(
        "an output message opening with a refusal",
        [USER, {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}],
        FAILS,  # 'ResponseOutputRefusal' object has no attribute 'text'
        FAILS,
    ),
]

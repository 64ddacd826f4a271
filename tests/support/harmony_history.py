"""gpt-oss Responses input histories and the harmony messages vLLM 0.33 and 0.34 render after the preamble (or how
they refuse them), read from `responses/harmony.py` response_input_to_harmony and `responses/protocol.py`
input_item_parsing of each release, and checked against those functions run from the releases' source
(tests/support/vllm_harmony_input.py). 0.34 keeps a reasoning item without content as an empty assistant message
where 0.33 skips it; its reading of an item without a type by `role` or `summary` changes nothing a request can
reach: pydantic keeps no untyped item without a role (it is no SDK type, or an item reference cut to its id)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.responses_history import CALL, RESULT, USER, text

REFUSED = "refused"  # vLLM answers 400 (or, 0.33 for an untyped item with an id, 500): the guard a 400
Rendered = list[tuple[str, str | None, str]]  # each message's role, channel and text
ASKED = ("user", None, "What is the weather in Paris?")
CALLED = ("assistant", "commentary", '{"city": "Paris"}')
ANSWERED = ("tool", "commentary", "Sunny, 21 C")
EMPTY = ("assistant", None, "")  # 0.34's message for a reasoning item without content
SUNNY = {"type": "message", "role": "assistant", "content": [text("output_text", "Sunny.")]}


@dataclass(frozen=True)
class HarmonyHistory:
    name: str
    items: list[dict[str, Any]]
    before: Rendered | str  # what 0.31-0.33 render, or REFUSED
    since: Rendered | str  # what 0.34 renders


HISTORIES = [
    HarmonyHistory(
        "an empty reasoning item before the answer",
        [USER, {"type": "reasoning", "id": "rs_1", "summary": []}, SUNNY, {"role": "user", "content": "And Rome?"}],
        [ASKED, ("assistant", "final", "Sunny."), ("user", None, "And Rome?")],
        [ASKED, EMPTY, ("assistant", "final", "Sunny."), ("user", None, "And Rome?")],
    ),
    HarmonyHistory(
        "a reasoning item with a summary only, before a call",
        [USER, {"type": "reasoning", "summary": [text("summary_text", "Look it up.")]}, CALL, RESULT],
        [ASKED, CALLED, ANSWERED],
        [ASKED, EMPTY, CALLED, ANSWERED],
    ),
    HarmonyHistory(
        "a reasoning item with empty content",
        [USER, {"type": "reasoning", "summary": [], "content": []}, CALL, RESULT],
        [ASKED, CALLED, ANSWERED],
        [ASKED, EMPTY, CALLED, ANSWERED],
    ),
    HarmonyHistory(
        "a reasoning item with neither a summary nor content",
        [USER, {"type": "reasoning"}, CALL, RESULT],
        REFUSED,  # ResponseReasoningItem needs a summary until 0.34 fills one in
        [ASKED, EMPTY, CALLED, ANSWERED],
    ),
    HarmonyHistory(
        "a reasoning item with content",
        [USER, {"type": "reasoning", "summary": [], "content": [text("reasoning_text", "Think.")]}, CALL, RESULT],
        [ASKED, ("assistant", "analysis", "Think."), CALLED, ANSWERED],
        [ASKED, ("assistant", "analysis", "Think."), CALLED, ANSWERED],
    ),
    HarmonyHistory(
        "a reasoning item whose content is one empty text",
        [USER, {"type": "reasoning", "summary": [], "content": [text("reasoning_text", "")]}, CALL, RESULT],
        [ASKED, ("assistant", "analysis", ""), CALLED, ANSWERED],
        [ASKED, ("assistant", "analysis", ""), CALLED, ANSWERED],
    ),
    HarmonyHistory(
        "an item without a type, with a summary",
        [USER, {"summary": [text("summary_text", "s")], "content": [text("reasoning_text", "Think.")]}, CALL, RESULT],
        REFUSED,
        REFUSED,  # no SDK type: never read as reasoning
    ),
    HarmonyHistory(
        "an item without a type, with an id and a summary",
        [USER, {"id": "rs_1", "summary": [text("summary_text", "s")]}, CALL, RESULT],
        REFUSED,  # an item reference {"id"}: 0.33 fails on its missing role (500)
        REFUSED,  # 0.34: "Unknown input type: None"
    ),
    HarmonyHistory(
        "an item without a type, with a role",
        [USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And Rome?"}],
        [ASKED, ("assistant", "final", "Sunny."), ("user", None, "And Rome?")],
        [ASKED, ("assistant", "final", "Sunny."), ("user", None, "And Rome?")],
    ),
    HarmonyHistory(
        "an item without a type, with a role and a summary",
        [USER, {"role": "assistant", "content": "Sunny.", "summary": []}, {"role": "user", "content": "And Rome?"}],
        [ASKED, ("assistant", "final", "Sunny."), ("user", None, "And Rome?")],
        [ASKED, ("assistant", "final", "Sunny."), ("user", None, "And Rome?")],
    ),
]


def rendered(messages: list[dict[str, Any]]) -> Rendered:
    """Messages as `Message.to_dict()` shapes, summed up as a history declares them."""
    return [(str(m["role"]), m.get("channel"), "".join(c["text"] for c in m["content"])) for m in messages]

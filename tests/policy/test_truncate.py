"""The truncate policy's pure parts: which side of the ids is kept, which messages may go (a tool call with its
results), and the visible marker."""

from __future__ import annotations

from typing import Any

from proxy.counting.ids import cut_middle
from proxy.policy.truncate import MARKER, droppable_units, keep_side


def test_keep_side() -> None:
    ids = list(range(10))
    assert keep_side(ids, 4, "left") == [6, 7, 8, 9]
    assert keep_side(ids, 4, "right") == [0, 1, 2, 3]
    assert keep_side(ids, 5, "middle") == [0, 1, 2, 8, 9]
    assert cut_middle(ids, 1) == ([0], [])


def test_tool_call_and_its_results_drop_together_and_kept_messages_never_drop() -> None:
    messages: list[Any] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "a"},
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "last"},
        {"role": "assistant", "content": "prefill"},
    ]
    assert droppable_units(messages) == [[1], [2, 3, 4], [5], [8]]


def test_marker_is_visible() -> None:
    assert "cut by token-guard" in MARKER.format(cut=5)

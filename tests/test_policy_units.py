"""The overflow policies' pure parts: choosing a policy, windows, cuts, tool-call units, and stream merging."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.counting.ids import char_cut, cut_middle, windows
from proxy.errors import InvalidRequest
from proxy.policy.choice import choose_policy, output_reserve
from proxy.policy.decide import Limits
from proxy.policy.merge import StreamMerger, merge_answers
from proxy.policy.truncate import droppable_units, keep_side
from proxy.settings import PolicySettings


def test_policy_comes_from_config_unless_the_client_asks() -> None:
    policy = PolicySettings(on_overflow="truncate")
    assert choose_policy(policy, {}) == "truncate"
    assert choose_policy(policy, {"x-token-guard-overflow": " Chunk "}) == "chunk"


def test_unknown_policy_header_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidRequest, match="must be one of reject, truncate, chunk; got 'split'"):
        choose_policy(PolicySettings(), {"x-token-guard-overflow": "split"})


def test_client_override_can_be_switched_off() -> None:
    policy = PolicySettings(allow_client_override=False)
    with pytest.raises(InvalidRequest, match="does not let clients choose"):
        choose_policy(policy, {"x-token-guard-overflow": "chunk"})
    assert choose_policy(policy, {"x-token-guard-overflow": "reject"}) == "reject"


def test_output_reserve_is_the_request_capped_at_half_the_window() -> None:
    limits = Limits(2048, min_output_tokens=4)
    assert output_reserve(100, limits) == 100
    assert output_reserve(5000, limits) == 1024
    assert output_reserve(None, limits) == 4
    assert output_reserve(None, Limits(2048, default_max_tokens="10%")) == 204


@given(length=st.integers(0, 5000), size=st.integers(2, 600), overlap_share=st.floats(0, 0.49))
def test_windows_cover_everything_in_order_with_the_overlap(length: int, size: int, overlap_share: float) -> None:
    overlap = int(size * overlap_share)
    spans = windows(length, size, overlap)
    if length == 0:
        assert spans == []
        return
    assert spans[0][0] == 0 and spans[-1][1] == length
    assert all(0 < e - s <= size for s, e in spans)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start == end - overlap


def test_keep_side() -> None:
    ids = list(range(10))
    assert keep_side(ids, 4, "left") == [6, 7, 8, 9]
    assert keep_side(ids, 4, "right") == [0, 1, 2, 3]
    assert keep_side(ids, 5, "middle") == [0, 1, 2, 8, 9]
    assert cut_middle(ids, 1) == ([0], [])


def test_char_cut_never_splits_a_character() -> None:
    starts = [0, 1, 1, 1, 2]  # token 1..3 are the bytes of one character
    assert [char_cut(starts, i, 3) for i in range(6)] == [0, 1, 2, 2, 2, 3]


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


def _chunk(kind: str, text: str, finish: str | None = None, role: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if kind == "chat":
        choice["delta"] = {"role": "assistant", "content": ""} if role else {"content": text}
    else:
        choice["text"] = text
    return {"id": "x", "object": "o", "created": 1, "model": "m", "choices": [choice]}


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_merge_gives_the_same_text_as_the_non_stream_merge(kind: str) -> None:
    parts = [["Hello", " there"], ["second"], ["third", "!"]]
    finishes = ["length", "stop", "stop"]
    merger = StreamMerger(kind, len(parts), " | ", include_usage=True)
    events: list[bytes] = []
    for i, texts in enumerate(parts):
        if kind == "chat":
            events += merger.feed(i, _chunk(kind, "", role=True))
        for j, text in enumerate(texts):
            events += merger.feed(i, _chunk(kind, text, finishes[i] if j == len(texts) - 1 else None))
        usage = {"prompt_tokens": 10, "total_tokens": 10 + len(texts), "completion_tokens": len(texts)}
        events += merger.feed(i, {"id": "x", "object": "o", "created": 1, "model": "m", "choices": [], "usage": usage})
    events += merger.finish()
    import json

    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert events[-1] == b"data: [DONE]\n\n"
    assert len({p["id"] for p in payloads}) == 1
    key = "delta" if kind == "chat" else None
    text = "".join((c["delta"].get("content") or "") if key else c["text"] for p in payloads for c in p["choices"])
    finish = [c["finish_reason"] for p in payloads for c in p["choices"] if c["finish_reason"]]
    assert finish == ["length"]  # one finish chunk, "length" because a part hit its limit
    roles = [p for p in payloads for c in p["choices"] if "role" in c.get("delta", {})]
    assert len(roles) == (1 if kind == "chat" else 0)
    assert payloads[-1]["usage"] == {"prompt_tokens": 30, "total_tokens": 35, "completion_tokens": 5}
    answers = [_answer(kind, "".join(t), f) for t, f in zip(parts, finishes, strict=True)]
    merged = merge_answers(kind, answers, " | ")
    expected = merged["choices"][0]["text" if kind == "completion" else "message"]
    assert text == (expected if kind == "completion" else expected["content"]) == "Hello there | second | third!"
    assert merged["choices"][0]["finish_reason"] == "length"


def _answer(kind: str, text: str, finish: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    choice.update({"text": text} if kind == "completion" else {"message": {"role": "assistant", "content": text}})
    return {"id": "a", "created": 1, "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 10, "total_tokens": 12, "completion_tokens": 2}}  # fmt: skip

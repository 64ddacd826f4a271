"""Merging a chunked request's answers: the streamed merge says exactly what the non-streamed one does."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.policy.merge import StreamMerger, merge_answers


def _event(kind: str, text: str, finish: str | None = None, role: bool = False) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
    if kind == "chat":
        choice["delta"] = {"role": "assistant", "content": ""} if role else {"content": text}
    else:
        choice["text"] = text
    return {"id": "x", "object": "o", "created": 1, "model": "m", "choices": [choice]}


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_merge_gives_the_same_text_as_the_non_stream_merge(kind: str) -> None:
    chunks = [["Hello", " there"], ["second"], ["third", "!"]]
    finishes = ["length", "stop", "stop"]
    merger = StreamMerger(kind, len(chunks), " | ", include_usage=True)
    events: list[bytes] = []
    for i, texts in enumerate(chunks):
        if kind == "chat":
            events += merger.feed(i, _event(kind, "", role=True))
        for j, text in enumerate(texts):
            events += merger.feed(i, _event(kind, text, finishes[i] if j == len(texts) - 1 else None))
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
    assert finish == ["length"]  # one finish event, "length" because a chunk hit its limit
    roles = [p for p in payloads for c in p["choices"] if "role" in c.get("delta", {})]
    assert len(roles) == (1 if kind == "chat" else 0)
    assert payloads[-1]["usage"] == {"prompt_tokens": 30, "total_tokens": 35, "completion_tokens": 5}
    answers = [_answer(kind, "".join(t), f) for t, f in zip(chunks, finishes, strict=True)]
    merged = merge_answers(kind, answers, " | ")
    expected = merged["choices"][0]["text" if kind == "completion" else "message"]
    assert text == (expected if kind == "completion" else expected["content"]) == "Hello there | second | third!"
    assert merged["choices"][0]["finish_reason"] == "length"


def _answer(kind: str, text: str, finish: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    choice.update({"text": text} if kind == "completion" else {"message": {"role": "assistant", "content": text}})
    return {"id": "a", "created": 1, "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 10, "total_tokens": 12, "completion_tokens": 2}}  # fmt: skip


def _usage_event(prompt: int, completion: int) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    return {"id": "x", "object": "o", "created": 1, "model": "m", "choices": [], "usage": usage}


def test_a_merged_stream_tells_what_its_chunks_used_once_it_ended() -> None:
    """Whether or not the client asked for a usage event: a keyed request's quota is settled from it."""
    merger = StreamMerger("chat", 2, "\n\n", include_usage=False, prior_usage=[{"prompt_tokens": 3}])
    merger.feed(0, _event("chat", "a", "stop"))
    merger.feed(0, _usage_event(100, 4))
    merger.feed(1, _event("chat", "b", "stop"))
    merger.feed(1, _usage_event(90, 6))
    assert merger.usage() is None  # not ended: a client that left part way keeps its reservation
    assert merger.finish() == [b"data: [DONE]\n\n"]  # not asked for: no usage event sent
    assert merger.usage() == {"prompt_tokens": 193, "total_tokens": 200, "completion_tokens": 10}


def test_a_merged_stream_whose_chunk_told_no_usage_tells_none() -> None:
    merger = StreamMerger("completion", 2, "", include_usage=True)
    merger.feed(0, _event("completion", "a", "stop"))
    merger.feed(0, _usage_event(100, 4))
    merger.feed(1, _event("completion", "b", "stop"))
    merger.finish()
    assert merger.usage() is None  # what chunk 1 used is unknown: the reservation stands rather than a guess of 0

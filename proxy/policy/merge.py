"""Merge the answers of a chunked request into one, in the usual shape: pure functions over parsed JSON.

Non-streaming: the chunks' answer texts joined in order with the separator, usage summed, finish_reason "length" if
any chunk hit its limit else the last chunk's, a fresh id. Streaming: `StreamMerger` turns the chunks' SSE events,
consumed chunk after chunk, into one well-formed stream: one role event, the separator between chunks, one finish
event, one usage event when the client asked for usage, one [DONE].
"""

from __future__ import annotations

import json
import secrets
from typing import Any

USAGE_KEYS = ("prompt_tokens", "total_tokens", "completion_tokens")


def fresh_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + "tg" + secrets.token_hex(8)


def sum_usage(usages: list[dict[str, Any] | None]) -> dict[str, int]:
    return {key: sum(int((u or {}).get(key) or 0) for u in usages) for key in USAGE_KEYS}


def told_usage(usages: list[dict[str, Any] | None]) -> dict[str, int] | None:
    """The summed usage when every answer told its own; None when one did not (what it used is unknown)."""
    return sum_usage(usages) if all(isinstance(u, dict) for u in usages) else None


def merged_finish(reasons: list[str | None]) -> str | None:
    return "length" if "length" in reasons else reasons[-1]


def answer_text(kind: str, answer: dict[str, Any]) -> str:
    choice = answer["choices"][0]
    value = choice.get("text") if kind == "completion" else (choice.get("message") or {}).get("content")
    return value or ""


def merge_answers(kind: str, answers: list[dict[str, Any]], separator: str) -> dict[str, Any]:
    merged = copy_json(answers[-1])
    merged["id"] = fresh_id(kind)
    merged["created"] = answers[0].get("created", merged.get("created"))
    choice = merged["choices"][0]
    text = separator.join(answer_text(kind, a) for a in answers)
    if kind == "completion":
        choice["text"] = text
    else:
        choice["message"]["content"] = text
    choice["finish_reason"] = merged_finish([a["choices"][0].get("finish_reason") for a in answers])
    merged["usage"] = {**(merged.get("usage") or {}), **sum_usage([a.get("usage") for a in answers])}
    return merged


def copy_json(value: dict[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = json.loads(json.dumps(value))
    return copied


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class StreamMerger:
    """Rewrites the SSE events of chunks 0..n-1 (fed in that order) into one stream."""

    def __init__(
        self, kind: str, chunks: int, separator: str, include_usage: bool, prior_usage: list[Any] | None = None
    ) -> None:
        self.kind, self.chunks, self.separator, self.include_usage = kind, chunks, separator, include_usage
        self.id = fresh_id(kind)
        self.created: Any = None
        self.model: Any = None
        self.usages: list[dict[str, Any] | None] = list(prior_usage or [])  # e.g. the chunks before a reduce step
        self.reasons: list[str | None] = []
        self._started: set[int] = set()
        self._expected = len(self.usages) + chunks  # one usage per chunk, and per prior answer
        self._finished = False

    def feed(self, index: int, event: dict[str, Any]) -> list[bytes]:
        """Chunk `index`'s next event (parsed), as what goes to the client."""
        if self.created is None:
            self.created, self.model = event.get("created"), event.get("model")
        event = {**event, "id": self.id, "created": self.created, "model": self.model}
        if not event.get("choices"):  # the chunk's usage event: summed into the one sent at the end
            self.usages.append(event.get("usage"))
            return []
        event.pop("usage", None)  # running usage of one chunk would mislead; the summed usage comes at the end
        out = []
        if index not in self._started:
            self._started.add(index)
            if index > 0 and self.separator:
                out.append(self._text_event(event, self.separator))
        choice = dict(event["choices"][0])
        if index > 0 and "delta" in choice and "role" in choice["delta"]:
            delta = {k: v for k, v in choice["delta"].items() if k != "role"}
            if not delta.get("content"):
                return out
            choice["delta"] = delta
        if choice.get("finish_reason") is not None:
            self.reasons.append(choice["finish_reason"])
            if index < self.chunks - 1:  # only the last chunk's finish event stays, carrying the merged reason
                choice.update(finish_reason=None, stop_reason=None)
                if not self._has_text(choice):
                    return out
            else:
                choice["finish_reason"] = merged_finish(self.reasons)
        out.append(sse({**event, "choices": [choice]}))
        return out

    def usage(self) -> dict[str, int] | None:
        """The summed usage once the stream has finished and every chunk told its usage; None before, or when one
        did not (a chunk that failed, or whose usage was not asked for)."""
        return told_usage(self.usages) if self._finished and len(self.usages) == self._expected else None

    def finish(self) -> list[bytes]:
        self._finished = True
        out = []
        if self.include_usage:
            usage = sum_usage(self.usages)
            out.append(sse({"id": self.id, "object": self._object(), "created": self.created, "model": self.model,
                            "choices": [], "usage": usage}))  # fmt: skip
        out.append(DONE)
        return out

    def events_of(self, answer: dict[str, Any]) -> list[bytes]:
        """A finished (merged) answer as the stream vLLM would have sent for it."""
        choice = answer["choices"][0]
        base = {"id": self.id, "object": self._object(), "created": answer.get("created"), "model": answer.get("model")}
        self.created, self.model = base["created"], base["model"]
        out = []
        if self.kind == "chat":
            out.append(sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}))  # fmt: skip
        last: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": choice.get("finish_reason")}
        if self.kind == "completion":
            last["text"] = choice.get("text") or ""
        else:
            last["delta"] = {"content": (choice.get("message") or {}).get("content") or ""}
        out.append(sse({**base, "choices": [last]}))
        self.usages.append(answer.get("usage"))
        return out + self.finish()

    def _object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion.chunk"

    def _has_text(self, choice: dict[str, Any]) -> bool:
        if self.kind == "completion":
            return bool(choice.get("text"))
        return bool((choice.get("delta") or {}).get("content"))

    def _text_event(self, template: dict[str, Any], text: str) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": None}
        if self.kind == "completion":
            choice["text"] = text
        else:
            choice["delta"] = {"content": text}
        return sse({**template, "choices": [choice]})

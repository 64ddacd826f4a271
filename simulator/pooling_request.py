"""The pooling bodies as vLLM 0.31 / 0.32's request models read them (entrypoints/pooling/*/protocol.py): embeddings
(`EmbeddingRequest`: a completion-style `input`, a conversation in `messages` or `input`, or a batch of them),
`/pooling` (completion, chat, or an IO processor's `data`), `/classify` (completion or chat), score (its four pairs
of fields) and rerank (`query` and `documents`), with pydantic's errors. The simulator's own reading, apart from the
guard's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from simulator.wire import Fields

Kind = Literal["embeddings", "pooling", "classify", "score", "rerank"]
ROUTES: dict[str, Kind] = {
    "/v1/embeddings": "embeddings", "/pooling": "pooling", "/classify": "classify",
    "/score": "score", "/v1/score": "score", "/rerank": "rerank", "/v1/rerank": "rerank", "/v2/rerank": "rerank",
}  # fmt: skip
SCORE_PAIRS = (("data_1", "data_2"), ("queries", "documents"), ("queries", "items"), ("text_1", "text_2"))


@dataclass(frozen=True)
class PoolingRequest:
    """Embeddings, /pooling, /classify: one prompt per input, or one per conversation."""

    body: dict[str, Any]
    model: str | None
    prompts: list[str | list[int]]  # the completion form
    conversations: list[list[dict[str, Any]]]  # the chat form (then `prompts` is empty)
    add_special_tokens: bool  # true for the completion form, false for the chat form, unless the body says
    truncate_prompt_tokens: int | None


@dataclass(frozen=True)
class ScoringRequest:
    """Score and rerank: each side's texts (a multimodal item holds none)."""

    body: dict[str, Any]
    kind: Kind
    model: str | None
    queries: list[str]
    documents: list[str]
    truncate_prompt_tokens: int | None
    top_n: int


def pooling_request(body: Any, kind: Kind) -> PoolingRequest | ScoringRequest:
    """Raises ApiError (400 "Bad Request") where vLLM's request model refuses the body."""
    fields = Fields(body)
    fields.check()
    if kind in ("score", "rerank"):
        return _scoring(fields, kind)
    conversations = _conversations(fields, kind)
    plugin = kind == "pooling" and not fields.has("input") and not fields.has("messages")  # IOProcessorRequest
    prompts = [] if conversations or plugin else _inputs(fields)
    req = PoolingRequest(
        body=fields.body, model=fields.str_or_none("model"), prompts=prompts, conversations=conversations,
        add_special_tokens=fields.boolean("add_special_tokens", not conversations),
        truncate_prompt_tokens=_truncation(fields),
    )  # fmt: skip
    fields.check()
    return req


def _conversation(value: Any) -> bool:
    """_is_chat_messages: a non-empty list of objects with a string role."""
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    )  # fmt: skip


def _batch(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_conversation(c) for c in value)


def _conversations(fields: Fields, kind: Kind) -> list[list[dict[str, Any]]]:
    """The chat form: `messages` (embeddings: or a batch of conversations); embeddings' `input` may carry either
    (normalize_input_messages moves it to `messages`)."""
    messages = fields.raw("messages")
    if messages is None and kind == "embeddings":
        messages = fields.raw("input") if _conversation(fields.raw("input")) or _batch(fields.raw("input")) else None
    if messages is None:
        return []
    if _conversation(messages):
        return [messages]
    if kind == "embeddings" and _batch(messages):
        return list(messages)
    fields.invalid("body.messages", "list_type", "Input should be a valid list of chat messages", messages)
    fields.check()
    return []


def _inputs(fields: Fields) -> list[str | list[int]]:
    """`input: list[int] | list[list[int]] | str | list[str]`."""
    value = fields.require("input")
    fields.check()
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(_token(t) for t in value):
        return [value] if value else []
    if isinstance(value, list) and (
        all(isinstance(p, str) for p in value) or all(isinstance(p, list) and all(_token(t) for t in p) for p in value)
    ):
        return list(value)  # fmt: skip
    fields.invalid("body.input", "union_type", "Input should be a valid string, a list of strings, a list of token "
                   "ids or a list of lists of token ids", value)  # fmt: skip
    return []


def _token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _truncation(fields: Fields) -> int | None:
    """`truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None`."""
    value = fields.int_or_none("truncate_prompt_tokens")
    if value is not None and value < -1:
        fields.invalid("body.truncate_prompt_tokens", "greater_than_equal",
                       "Input should be greater than or equal to -1", value)  # fmt: skip
    return value


def _scoring(fields: Fields, kind: Kind) -> ScoringRequest:
    """RerankRequest, or the first ScoreRequest whose two fields the body has."""
    if kind == "rerank":
        pair = ("query", "documents")
    else:
        pair = next((p for p in SCORE_PAIRS if fields.has(p[0]) and fields.has(p[1])), SCORE_PAIRS[0])
    first, second = fields.require(pair[0]), fields.require(pair[1])
    top_n = fields.integer("top_n", 0) if kind == "rerank" else 0
    if top_n < 0:
        fields.invalid("body.top_n", "greater_than_equal", "Input should be greater than or equal to 0", top_n)
    req = ScoringRequest(
        body=fields.body, kind=kind, model=fields.str_or_none("model"), queries=_texts(fields, pair[0], first),
        documents=_texts(fields, pair[1], second), truncate_prompt_tokens=_truncation(fields), top_n=top_n,
    )  # fmt: skip
    fields.check()
    return req


def _texts(fields: Fields, key: str, value: Any) -> list[str]:
    """`ScoreInput | list[ScoreInput]`, ScoreInput a string or a multimodal item."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    for i, item in enumerate(items):
        if not isinstance(item, str | dict):
            fields.invalid(f"body.{key}.{i}", "string_type", "Input should be a valid string", item)
    return [item for item in items if isinstance(item, str)]

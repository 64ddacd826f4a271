"""The pooling requests as the guard reads them: embeddings, `/pooling` and `/classify` (each input its own prompt:
strings, token ids, or chat conversations), and score / rerank (texts vLLM pairs or embeds one by one). Only the
fields that change the count are read; every other field stays in `body` untouched.

vLLM 0.31 / 0.32 (`entrypoints/pooling/*/protocol.py`): a completion-style `input` is a string, strings, token ids or
lists of token ids, tokenized with `add_special_tokens` (default true); a chat form (`messages`, or on embeddings an
`input` that is a conversation or a list of them) renders with `add_generation_prompt` default **false** and
`add_special_tokens` default false. `truncate_prompt_tokens` (>= -1) applies to each prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy.api.body import count_field, flag, kind_of, model_name, token_ids
from proxy.errors import InvalidRequest

Kind = Literal["embeddings", "pooling", "classify", "score", "rerank"]
KINDS: dict[str, Kind] = {
    "/v1/embeddings": "embeddings", "/pooling": "pooling", "/classify": "classify",
    "/score": "score", "/v1/score": "score", "/rerank": "rerank", "/v1/rerank": "rerank", "/v2/rerank": "rerank",
}  # fmt: skip
SCORE_PAIRS = (("data_1", "data_2"), ("queries", "documents"), ("queries", "items"), ("text_1", "text_2"))
CHAT_FIELDS = ("add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
               "chat_template_kwargs")  # fmt: skip


@dataclass(frozen=True)
class PoolingRequest:
    """Embeddings, /pooling, /classify: one prompt per input, or one per conversation."""

    body: dict[str, Any]
    kind: Kind
    model: str | None
    prompts: list[str | list[int]]  # completion-style inputs
    conversations: list[list[dict[str, Any]]]  # the chat form (then `prompts` is empty)
    add_special_tokens: bool
    truncate_prompt_tokens: int | None

    @property
    def param(self) -> str:
        return "messages" if self.conversations else "input"

    @property
    def uncounted(self) -> bool:
        """Nothing the guard can count: a /pooling request for an IO-processor plugin, which reads its own `data`."""
        return not self.prompts and not self.conversations

    def chat_body(self, conversation: list[dict[str, Any]]) -> dict[str, Any]:
        """One conversation as the chat request vLLM renders: the pooling defaults written out, so that a chat
        counter (or the upstream's /tokenize) renders it as vLLM's pooling path does."""
        body = {key: self.body[key] for key in CHAT_FIELDS if self.body.get(key) is not None}
        return {**body, "messages": conversation, "add_generation_prompt": flag(self.body, "add_generation_prompt",
                                                                                 False)}  # fmt: skip


@dataclass(frozen=True)
class ScoringRequest:
    """Score and rerank: the texts on each side (multimodal items are not counted), each side's token cap."""

    body: dict[str, Any]
    kind: Kind
    model: str | None
    queries: list[str]
    documents: list[str]
    max_tokens_per_query: int
    max_tokens_per_doc: int
    truncate_prompt_tokens: int | None


def pooling_request(body: dict[str, Any], kind: Kind) -> PoolingRequest | ScoringRequest:
    if kind in ("score", "rerank"):
        return _scoring(body, kind)
    conversations, prompts = _conversations(body, kind), []
    plugin = kind == "pooling" and "input" not in body and "messages" not in body  # an IO processor's `data`
    if not conversations and not plugin:
        prompts = _inputs(body.get("input"))
    return PoolingRequest(
        body=body, kind=kind, model=model_name(body), prompts=prompts, conversations=conversations,
        add_special_tokens=flag(body, "add_special_tokens", not conversations),
        truncate_prompt_tokens=_truncation(body),
    )  # fmt: skip


def _conversations(body: dict[str, Any], kind: Kind) -> list[list[dict[str, Any]]]:
    """The chat form: `messages` (one conversation, or on embeddings a batch), or on embeddings an `input` that is
    a conversation or a batch of them."""
    messages = body.get("messages")
    if messages is None and kind == "embeddings" and _is_conversation(body.get("input")):
        return [body["input"]]
    if messages is None and kind == "embeddings" and _is_batch(body.get("input")):
        return list(body["input"])
    if messages is None:
        return []
    if _is_conversation(messages):
        return [messages]
    if kind == "embeddings" and _is_batch(messages):
        return list(messages)
    expected = "a non-empty array of message objects" + (" or of conversations" if kind == "embeddings" else "")
    raise InvalidRequest(f"'messages' must be {expected}.", param="messages")


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    )  # fmt: skip


def _is_batch(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_conversation(c) for c in value)


def _inputs(value: Any) -> list[str | list[int]]:
    expected = "'input' must be a string, an array of strings, an array of token ids, or an array of those."
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise InvalidRequest(expected, param="input")
    if token_ids(value):
        return [value] if value else []
    if all(isinstance(p, str) for p in value) or all(isinstance(p, list) and token_ids(p)
                                                      for p in value):  # fmt: skip
        return list(value)
    raise InvalidRequest(expected + " Strings and token ids cannot be mixed.", param="input")


def _truncation(body: dict[str, Any]) -> int | None:
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidRequest(f"'truncate_prompt_tokens' must be an integer of at least -1, got {value!r}.",
                             param="truncate_prompt_tokens")  # fmt: skip
    return value


def _scoring(body: dict[str, Any], kind: Kind) -> ScoringRequest:
    if kind == "rerank":
        pair: tuple[str, str] | None = ("query", "documents")
    else:
        pair = next((p for p in SCORE_PAIRS if p[0] in body and p[1] in body), None)
    if pair is None or pair[0] not in body or pair[1] not in body:
        fields = "'query' and 'documents'" if kind == "rerank" else " or ".join(f"{a}/{b}" for a, b in SCORE_PAIRS)
        raise InvalidRequest(f"A {kind} request needs {fields}.", param=pair[0] if pair else None)
    return ScoringRequest(
        body=body, kind=kind, model=model_name(body),
        queries=_texts(body, pair[0]), documents=_texts(body, pair[1]),
        max_tokens_per_query=count_field(body, "max_tokens_per_query") or 0,
        max_tokens_per_doc=count_field(body, "max_tokens_per_doc") or 0,
        truncate_prompt_tokens=_truncation(body),
    )  # fmt: skip


def _texts(body: dict[str, Any], key: str) -> list[str]:
    """A side's texts: a string or an item, or a list of them; multimodal items hold no text the guard counts."""
    value = body[key]
    items = value if isinstance(value, list) else [value]
    for item in items:
        if not isinstance(item, str | dict):
            raise InvalidRequest(f"'{key}' must hold strings or content items, got {kind_of(item)}.", param=key)
    return [item for item in items if isinstance(item, str)]

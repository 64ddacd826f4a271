"""`POST /invocations` (SageMaker) as vLLM 0.31 and 0.32 dispatch it (`entrypoints/serve/sagemaker/api_router.py`): the
first request model that validates the whole body gets it, chat then completions for a generative model; the simulator,
which also answers the pooling routes, tries embeddings, rerank and score after those. Written from vLLM's source for
the simulator, apart from the guard's reading (which refuses a body holding the prompts of two endpoints; vLLM runs
the first that validates)."""

from __future__ import annotations

from typing import Any, Literal

from simulator.errors import ApiError, validation_error

Kind = Literal["chat", "completion", "embeddings", "rerank", "score"]
NO_HANDLER = "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"
# ScoreRequest's pairs of fields (queries and documents or items, data_1 and data_2, text_1 and text_2)
SCORE_FIELDS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


def dispatched(body: Any) -> Kind:
    """The endpoint `body` runs on, or vLLM's 400."""
    if not isinstance(body, dict):
        raise ApiError(NO_HANDLER)
    if _takes_chat(body):
        return "chat"
    prompt, embeds = body.get("prompt"), body.get("prompt_embeds")
    pooled = _pooling_kind(body) if prompt is None and embeds is None else None
    if pooled is not None:
        return pooled
    # CompletionRequest's before-validator: its error is not pydantic's, so it ends the dispatch
    if prompt in (None, "") and embeds in (None, []):
        raise validation_error("Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt")
    if prompt is not None and not _a_prompt(prompt):
        raise ApiError(NO_HANDLER)
    return "completion"


def _pooling_kind(body: dict[str, Any]) -> Kind | None:
    """The pooling route of a body without a prompt: an `input` embeds; a query with documents reranks; a pair of
    ScoreRequest's fields scores."""
    if body.get("input") is not None:
        return "embeddings"
    if {"query", "documents"} <= body.keys():
        return "rerank"
    return "score" if any(set(pair) <= body.keys() for pair in SCORE_FIELDS) else None


def _takes_chat(body: dict[str, Any]) -> bool:
    """ChatCompletionRequest validates: its messages (objects with a string role, content a string, parts or null),
    and its `logprobs` a boolean, where completions' is a count (`"logprobs": 5` goes to completions)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            return False
        if not (message.get("content") is None or isinstance(message["content"], str | list)):
            return False
    return body.get("logprobs") in (None, True, False)


def _a_prompt(prompt: Any) -> bool:
    """CompletionRequest.prompt: a string, a list of strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list):
        return False
    texts = all(isinstance(item, str) for item in prompt)
    return texts or _token_ids(prompt) or all(_token_ids(item) for item in prompt)


def _token_ids(values: Any) -> bool:
    return isinstance(values, list) and all(type(value) is int and value >= 0 for value in values)

"""`POST /invocations` (SageMaker): which endpoint vLLM hands a body to.

vLLM 0.31/0.32 (`entrypoints/serve/sagemaker/api_router.py` with `get_generate_invocation_types`) tries the request
models of a generative model in order, chat then completions, and the first that validates gets the body: a `messages`
list of message objects makes it chat, else a `prompt` makes it completions. Responses- or Anthropic-shaped bodies are
never dispatched to those APIs.

A pooling model's list (`entrypoints/pooling/factories.py`, `get_pooling_invocation_types`) is embeddings (or
classify), then rerank, score and pooling: a body with an `input` and no `prompt` is embeddings (counted the same as
classify and pooling), one with `query` and `documents` rerank, one with a score pair score. The guard cannot see
which kind of model serves, so a `messages` body stays chat (an embedding model would render it without the generation
prompt: counted a few tokens high, never low).

A body that holds the prompts of two endpoints (`messages` and `prompt`, `prompt` and `input`, `input` and a rerank
query, ...) is refused: vLLM hands it to the first request model that validates it whole, so one field the guard never
reads (`"logprobs": 5` fails chat and leaves completions) decides which prompt runs.

The model is not the body's: vLLM's handler is wrapped in model_hosting_container_standards' `inject_adapter_id(
adapter_path="model")`, which sets the body's `model` to the `X-Amzn-SageMaker-Adapter-Identifier` header (any case;
the first of a repeated one), and to null when the header is absent, before the body is read. So `{"model": "b"}`
runs the server's default model, and a header naming a LoRA adapter or another served name runs that one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from proxy.api.body import token_ids
from proxy.api.honoured import ADAPTER
from proxy.api.pooling import SCORE_PAIRS
from proxy.errors import InvalidRequest

NO_HANDLER = "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"
NO_PROMPT = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"


def invoked_body(body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """The body vLLM's handler reads: its `model` the adapter header's value, or null without one (`body` itself
    when that changes nothing)."""
    model = headers.get(ADAPTER)
    return body if body.get("model") == model else {**body, "model": model}


def invocation_kind(body: dict[str, Any]) -> Literal["chat", "completion", "embeddings", "rerank", "score"]:
    """The endpoint vLLM dispatches `body` to; a 400 with vLLM's own text when it dispatches it nowhere, and the
    guard's own when it holds the prompts of more than one endpoint."""
    named = _prompt_fields(body)
    if len(named) > 1:
        raise InvalidRequest(
            f"token-guard refuses an /invocations body with the prompts of more than one endpoint ({named[0]} and "
            f"{named[1]}): vLLM runs those of the first endpoint whose request model takes the whole body, which "
            "token-guard does not check. Send the fields of one endpoint.",
            param=named[1],
        )
    messages = body.get("messages")
    if isinstance(messages, list) and all(_is_message(m) for m in messages):
        return "chat"
    prompt, embeds = body.get("prompt"), body.get("prompt_embeds")
    if prompt is None and embeds is None:
        if body.get("input") is not None:
            return "embeddings"
        if "query" in body and "documents" in body:
            return "rerank"
        if any(a in body and b in body for a, b in SCORE_PAIRS):
            return "score"
    if prompt in (None, "") and embeds in (None, []):
        # CompletionRequest's before-validator refuses it, and that error leaves vLLM's dispatch loop at once
        raise InvalidRequest(NO_PROMPT, param="prompt")
    if prompt is not None and not _is_prompt(prompt):
        raise InvalidRequest(NO_HANDLER)
    return "completion"


def _prompt_fields(body: dict[str, Any]) -> list[str]:
    """The first field of each endpoint's prompt that `body` holds: chat's messages, completions' prompt or
    prompt_embeds, embeddings' input, rerank's query and documents, a score pair."""

    def held(*keys: str) -> bool:
        return all(body.get(key) is not None for key in keys)

    found = [next((key for key in keys if held(key)), None) for keys in (("messages",), ("prompt", "prompt_embeds"),
                                                                          ("input",))]  # fmt: skip
    found += ["query" if held("query", "documents") else None, next((a for a, b in SCORE_PAIRS if held(a, b)), None)]
    return [key for key in found if key is not None]


def _is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and (message.get("content") is None or isinstance(message["content"], str | list))
    )


def _is_prompt(prompt: Any) -> bool:
    """CompletionRequest.prompt: a string, strings, token ids, or lists of token ids."""
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list):
        return False
    return (
        all(isinstance(p, str) for p in prompt)
        or token_ids(prompt)
        or all(isinstance(p, list) and token_ids(p) for p in prompt)
    )

"""POST /v2/embed (Cohere's embed API), as vLLM 0.31 / 0.32 answer it for a text embedding model: texts embedded as
completion-style inputs, inputs of text parts as one user message each through the chat template; `truncate` END
(the default) keeps each prompt's first `max_tokens` tokens (the window when absent), START its last, NONE cuts
nothing (over the window: the pooling 400; over `max_tokens`: refused once embedded). The answer holds the vectors in
each requested type and the tokens billed."""

from __future__ import annotations

import base64
import struct
from typing import Any

from simulator.chat_prompt import ChatOptions, render_chat
from simulator.cohere_request import EmbedRequest, read_embed_request
from simulator.context import Context, response_id
from simulator.errors import ApiError, validation_error
from simulator.limits import OutputRequest
from simulator.pooling import fitted, vector

TYPES = ("float", "binary", "ubinary", "base64")  # the order vLLM's answer lists them in


def cohere_embed(ctx: Context, body: Any, headers: dict[str, str]) -> dict[str, Any]:
    req = read_embed_request(body)
    if req.model and req.model not in ctx.settings.served:  # the pooling routes' wording: no aliases, no param
        raise ApiError(f"The model `{req.model}` does not exist.", status=404, type="NotFoundError")
    types = _types(body.get("embedding_types"))
    if req.input_type is not None:
        raise ApiError(f"Unsupported input_type {req.input_type!r}. This model does not define any input_type task "
                       "instructions.")  # fmt: skip
    prompts = [_cut(ctx, req, ids, chars) for ids, chars in _prompts(ctx, req)]
    if req.truncate == "NONE" and req.max_tokens is not None:
        over = next((len(ids) for ids in prompts if len(ids) > req.max_tokens), None)
        if over is not None:
            raise ApiError(f"Input of {over} tokens exceeds max_tokens={req.max_tokens} with truncate=NONE. Set "
                           "truncate to END or START to allow truncation.")  # fmt: skip
    vectors = [vector(ids) for ids in prompts]
    answer: dict[str, Any] = {"id": response_id("embd", headers, None), "embeddings": _typed(vectors, types)}
    if req.texts:
        answer["texts"] = req.texts
    billed = {"input_tokens": sum(len(ids) for ids in prompts), "image_tokens": 0}
    answer.update(meta={"api_version": {"version": "2"}, "billed_units": billed}, response_type="embeddings_by_type")
    return answer


def _types(value: Any) -> list[str]:
    if value is None:
        return ["float"]
    if not isinstance(value, list) or any(t not in TYPES for t in value):
        raise ApiError(f"'embedding_types' must be a list of {', '.join(TYPES)}.", type="Bad Request",
                       param="body.embedding_types")  # fmt: skip
    return value


def _prompts(ctx: Context, req: EmbedRequest) -> list[tuple[list[int], int | None]]:
    if req.texts:
        return [(ctx.tokenizer.encode(text, True), len(text)) for text in req.texts]
    if any(part["type"] != "text" for conversation in req.conversations for part in conversation[0]["content"]):
        raise ApiError(f"{ctx.settings.model} is not a multimodal model")
    strips = ctx.profile.strips_billing_header
    rendered = [
        render_chat(ctx.tokenizer, ChatOptions(c, add_generation_prompt=False), strips) for c in req.conversations
    ]
    return [(chat.token_ids, len(chat.text)) for chat in rendered]


def _cut(ctx: Context, req: EmbedRequest, ids: list[int], chars: int | None) -> list[int]:
    """The ids vLLM embeds: START keeps the last tokens, END the first; NONE refuses a prompt over the window."""
    window, keep = ctx.settings.max_model_len, req.keep
    if keep is not None and keep > window:
        raise validation_error(f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = {window}. "
                               "Please request a smaller truncation size.", parameter="truncate_prompt_tokens",
                               value=keep)  # fmt: skip
    if keep is None:
        return fitted(ctx, OutputRequest(window, None), ids, chars)
    kept = window if keep == -1 else keep
    ids = ids[len(ids) - kept :] if req.truncate == "START" and kept else ids[:kept]
    if not ids:
        raise ApiError("The decoder prompt cannot be empty")
    return ids


def _typed(vectors: list[list[float]], types: list[str]) -> dict[str, Any]:
    typed: dict[str, Any] = {}
    for kind in TYPES:
        if kind not in types:
            continue
        if kind == "float":
            typed[kind] = vectors
        elif kind == "base64":
            typed[kind] = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
        else:
            typed[kind] = [_bits(v, signed=kind == "binary") for v in vectors]
    return typed


def _bits(vec: list[float], signed: bool) -> list[int]:
    """vLLM's packing: one bit per dimension (1 for >= 0), eight to a byte, most significant first."""
    packed = []
    for start in range(0, len(vec), 8):
        byte = sum(1 << (7 - i) for i, x in enumerate(vec[start : start + 8]) if x >= 0)
        packed.append(byte - 128 if signed else byte)
    return packed

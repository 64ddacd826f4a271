"""The pooling routes (`/v1/embeddings`, `/pooling`, `/classify`, `/score`, `/rerank` and their aliases) answered in
vLLM 0.31's and 0.32's shapes, as a bi-encoder embedding model would: each input (or conversation) is its own
prompt, vectors are made up from its token ids (the same ids, the same vector), usage counts every prompt.

The length rules are generation's with no output (limits.py with T = 0): a prompt of exactly max_model_len passes,
`truncate_prompt_tokens` (-1: the window) keeps each prompt's first tokens, as vLLM's pooling tokenizers cut on the
right, and a longer prompt gets vLLM's 400.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct
import time
from typing import Any

from simulator.chat_prompt import ChatOptions, check_prompt_flags, render_chat
from simulator.context import Context, response_id
from simulator.errors import ApiError
from simulator.invocations import dispatched
from simulator.limits import (
    OutputRequest,
    PromptShape,
    check_prompt_text,
    check_prompt_tokens,
    check_request,
    truncation_length,
)
from simulator.orjson_text import Float32s
from simulator.pooling_request import Kind, PoolingRequest, ScoringRequest, pooling_request
from simulator.responses import usage

DIMENSIONS = 16
PREFIX = {"embeddings": "embd", "pooling": "pooling", "classify": "classify", "score": "score", "rerank": "score"}


def pool(ctx: Context, body: Any, kind: Kind, headers: dict[str, str]) -> dict[str, Any]:
    """The JSON answer, or the ApiError vLLM would send."""
    if not isinstance(body, dict):
        raise ApiError("Input should be a valid dictionary", type="Bad Request")
    req = pooling_request(body, kind)
    ctx.check_model(req.model)
    limits = OutputRequest(ctx.settings.max_model_len, None, truncate_prompt_tokens=req.truncate_prompt_tokens)
    _raise(check_request(ctx.profile, limits))
    answer = {"id": response_id(PREFIX[kind], headers, _str(body.get("request_id")))}
    if isinstance(req, ScoringRequest):
        return {**answer, **_scored(ctx, req, limits)}
    prompts = [fitted(ctx, limits, ids, chars) for ids, chars in _prompts(ctx, req)]
    usage = _usage(ctx, sum(len(ids) for ids in prompts))
    single = ctx.profile.pools_with_orjson  # 0.33 hands orjson the embeddings as a float32 ndarray
    data = [_item(kind, i, vector(ids), body.get("encoding_format"), single) for i, ids in enumerate(prompts)]
    return {**answer, "object": "list", "created": int(time.time()), "model": ctx.settings.model, "data": data,
            "usage": usage}  # fmt: skip


def _prompts(ctx: Context, req: PoolingRequest) -> list[tuple[list[int], int | None]]:
    """Each prompt's token ids and, for text, its characters (the renderer's pre-check reads them)."""
    if req.conversations:
        check_prompt_flags(req.body)
        rendered: list[tuple[list[int], int | None]] = []
        for conversation in req.conversations:
            options = ChatOptions(
                conversation, add_generation_prompt=bool(req.body.get("add_generation_prompt", False)),
                continue_final_message=bool(req.body.get("continue_final_message", False)),
                add_special_tokens=req.add_special_tokens,
            )  # fmt: skip
            chat = render_chat(ctx.tokenizer, options, ctx.profile.strips_billing_header)
            rendered.append((chat.token_ids, len(chat.text)))
        return rendered
    return [
        (ctx.tokenizer.encode(p, req.add_special_tokens), len(p)) if isinstance(p, str) else (list(p), None)
        for p in req.prompts
    ]


def fitted(ctx: Context, limits: OutputRequest, ids: list[int], chars: int | None) -> list[int]:
    """The ids the engine gets: cut on the right when truncation is asked for, else vLLM's 400 when too long."""
    shape = PromptShape(len(ids), chars, ctx.tokenizer.max_chars_per_token)
    _raise(check_prompt_text(ctx.profile, limits, shape))
    keep = truncation_length(ctx.profile, limits)
    if keep is not None:
        return ids[:keep]
    counted = min(len(ids), limits.max_model_len + 1) if chars is not None else len(ids)
    _raise(check_prompt_tokens(ctx.profile, limits, counted))
    if not ids:
        raise ApiError("The decoder prompt cannot be empty")
    return ids


def _scored(ctx: Context, req: ScoringRequest, limits: OutputRequest) -> dict[str, Any]:
    """A bi-encoder: every text embedded alone (the query once), scores are cosine similarities."""
    queries = [fitted(ctx, limits, ctx.tokenizer.encode(t, True), len(t)) for t in req.queries]
    documents = [fitted(ctx, limits, ctx.tokenizer.encode(t, True), len(t)) for t in req.documents]
    if len(queries) != 1 and len(queries) != len(documents):
        raise ApiError("Input lengths must be either 1:1, 1:N or N:N")
    pairs = [(queries[0] if len(queries) == 1 else queries[i], d) for i, d in enumerate(documents)]
    scores = [_cosine(vector(q), vector(d)) for q, d in pairs]
    tokens = sum(len(ids) for ids in queries + documents)
    if req.kind == "score":
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return {"object": "list", "created": int(time.time()), "model": ctx.settings.model, "data": data,
                "usage": _usage(ctx, tokens)}  # fmt: skip
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
    top_n = req.top_n or len(ranked)
    results = [{"index": i, "document": {"text": req.documents[i], "multi_modal": None},
                "relevance_score": scores[i]} for i in ranked[:top_n]]  # fmt: skip
    return {"model": ctx.settings.model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "results": results}  # fmt: skip


def _item(kind: Kind, index: int, vector: list[float], encoding: Any, single: bool) -> dict[str, Any]:
    if kind == "classify":
        probs = [1 / (1 + math.exp(-vector[0])), 0.0]
        probs[1] = 1 - probs[0]
        return {"index": index, "label": f"LABEL_{probs.index(max(probs))}", "probs": probs, "num_classes": 2}
    value: list[float] | str = vector
    if encoding == "base64":  # float32, native (little-endian) order, as vLLM and the OpenAI SDK's default
        value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    if kind == "pooling":
        return {"index": index, "object": "pooling", "data": value}
    if single and isinstance(value, list):
        value = Float32s(value)
    return {"index": index, "object": "embedding", "embedding": value}


def vector(ids: list[int]) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).digest()[:8], "little")
    rng = random.Random(seed)
    raw = [rng.gauss(0, 1) for _ in range(DIMENSIONS)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _usage(ctx: Context, tokens: int) -> dict[str, Any]:
    return usage(tokens, 0, ctx.profile.omits_null_details)


def _raise(error: ApiError | None) -> None:
    if error is not None:
        raise error


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def pooling_invocation(body: Any) -> Kind | None:
    """The pooling endpoint vLLM's /invocations would hand `body` to, or None for the generation endpoints."""
    try:
        kind = dispatched(body)
    except ApiError:
        return None  # the generation endpoints answer it with vLLM's error
    return kind if kind in ("embeddings", "rerank", "score") else None

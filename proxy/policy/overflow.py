"""What to do when a prompt does not fit and the policy is truncate or chunk: turn the reject plan into a cut
request to forward, or into the chunks of a chunked request. Falls back to the foundation's 400, saying why, when the
policy cannot help."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.api.body import with_changes
from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.local_count import count_chat
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import ContextLengthExceeded
from proxy.policy.choice import output_reserve
from proxy.policy.chunk import (
    CannotChunk,
    Split,
    output_shares,
    refuse_too_many_chunks,
    refuse_unsound,
    split_chat,
    split_completion,
)
from proxy.policy.decide import Action, Limits, Plan, decide_chat, decide_completion
from proxy.policy.outcome import Chunked, Decision, Forward, Outcome, Refuse
from proxy.policy.truncate import Truncation, truncate_chat, truncate_completion
from proxy.settings import Overflow, PolicySettings


def refuse(plan: Plan, why: str) -> Refuse:
    """The plan's refusal, saying `why` the overflow policy did not apply (a request over the whole KV budget keeps
    its own reason: no policy would have made it fit)."""
    assert plan.error is not None
    if not isinstance(plan.error, ContextLengthExceeded):
        return Refuse(plan.error, Decision.of(plan))
    error = ContextLengthExceeded(f"{plan.error.message} {why}", param=plan.error.param or "messages")
    return Refuse(error, Decision.of(plan))


async def overflow_chat(
    tok: ModelTokenizer, counter: TokenCounter, req: ChatRequest, plan: Plan, limits: Limits, policy: PolicySettings,
    choice: str,
) -> Outcome:  # fmt: skip
    requested = req.requested_output
    budget = limits.max_model_len - output_reserve(requested[1] if requested else None, limits)

    async def count(messages: list[Any]) -> int:
        return await count_chat(tok, replace(req, messages=messages), counter)

    if choice == Overflow.TRUNCATE:
        cut = await truncate_chat(tok, req.messages, plan.prompt_tokens, budget, count, counter)
        if cut is None:
            return refuse(plan, "Truncation could not make it fit: the kept system prompt and last user message "
                                "alone are too long.")  # fmt: skip
        trimmed = _chat_with(req, cut.prompt)
        fitted = decide_chat(trimmed, cut.prompt_tokens, limits)
        return Forward(with_changes(trimmed.body, fitted.changes), _truncated(fitted, cut), fitted.cost(limits, req.n))
    try:
        refuse_unsound(req.body, req.n, "chat")
        refuse_too_many_chunks(plan.prompt_tokens, policy.chunk_tokens)
        split = await split_chat(
            tok, req, budget, policy.chunk_tokens, policy.chunk_overlap, policy.chunk_prompt, count
        )
        limits_each = _shares(requested[1] if requested else None, len(split.prompts), policy)
    except CannotChunk as exc:
        return refuse(plan, f"The chunk policy was not applied: {exc}.")
    chunks = [_limited_to(_chat_with(req, m), share) for m, share in zip(split.prompts, limits_each, strict=True)]
    plans = [decide_chat(chunk, n, limits) for chunk, n in zip(chunks, split.prompt_tokens, strict=True)]
    bodies = [{**chunk.body, **p.changes} for chunk, p in zip(chunks, plans, strict=True)]
    return _chunked("chat", req, plan, split, bodies, [p.cost(limits, 1) for p in plans], policy)


async def overflow_completion(
    tok: ModelTokenizer, req: CompletionRequest, counts: list[int], plan: Plan, limits: Limits,
    policy: PolicySettings, choice: str,
) -> Outcome:  # fmt: skip
    budget = limits.max_model_len - output_reserve(req.requested_output[1], limits)
    if choice == Overflow.TRUNCATE:
        cut = await truncate_completion(tok, req, counts, budget, policy.truncate_side)
        trimmed = replace(req, prompts=[cut.prompt] if len(req.prompts) == 1 else cut.prompt,
                          body={**req.body, "prompt": cut.prompt})  # fmt: skip
        fitted = decide_completion(trimmed, [len(p) for p in trimmed.prompts], limits)
        cost = fitted.cost(limits, req.n * len(trimmed.prompts))
        return Forward(with_changes(trimmed.body, fitted.changes), _truncated(fitted, cut), cost)
    try:
        refuse_unsound(req.body, req.n, "completion")
        refuse_too_many_chunks(max(counts), policy.chunk_tokens)
        if len(req.prompts) != 1:
            raise CannotChunk("the chunk policy cannot split a batch of prompts")
        split = await split_completion(tok, req, budget, policy.chunk_tokens, policy.chunk_overlap)
        limits_each = _shares(req.requested_output[1], len(split.prompts), policy)
    except CannotChunk as exc:
        return refuse(plan, f"The chunk policy was not applied: {exc}.")
    bodies, costs = [], []
    for ids, share in zip(split.prompts, limits_each, strict=True):
        chunk = replace(req, prompts=[ids], body={**req.body, "prompt": ids})
        if share is not None:
            chunk = replace(chunk, max_tokens=share, body={**chunk.body, "max_tokens": share})
        chunk_plan = decide_completion(chunk, [len(ids)], limits)
        bodies.append({**chunk.body, **chunk_plan.changes})
        costs.append(chunk_plan.cost(limits, 1))
    return _chunked("completion", req, plan, split, bodies, costs, policy)


def _shares(requested: int | None, chunks: int, policy: PolicySettings) -> list[int | None]:
    """Each chunk's output limit: with `chunk_merge = "concat"` the chunks' answers are the answer, so they share the
    client's limit; with "reduce" they are notes for the combining request, whose answer the client's limit bounds,
    so each keeps the limit as asked. A request that names no limit leaves each chunk to its own."""
    if requested is None or policy.chunk_merge != "concat":
        return [None] * chunks
    return list(output_shares(requested, chunks))


def _limited_to(req: ChatRequest, share: int | None) -> ChatRequest:
    """The chunk with every output-limit field it sent set to its share."""
    if share is None:
        return req
    max_tokens = share if req.max_tokens is not None else None
    completion = share if req.max_completion_tokens is not None else None
    sent = {name: share for name, value in (("max_tokens", max_tokens), ("max_completion_tokens", completion)) if value}
    return replace(req, body={**req.body, **sent}, max_tokens=max_tokens, max_completion_tokens=completion)


def _chat_with(req: ChatRequest, messages: list[Any]) -> ChatRequest:
    return replace(req, messages=messages, body={**req.body, "messages": messages})


def _truncated(fitted: Plan, cut: Truncation) -> Decision:
    return Decision(
        Action.TRUNCATE, fitted.prompt_tokens, fitted.max_tokens,
        dropped_messages=cut.dropped_messages, truncated_tokens=cut.cut_tokens,
    )  # fmt: skip


def _chunked(kind: str, req: ChatRequest | CompletionRequest, plan: Plan, split: Split,
             bodies: list[dict[str, Any]], costs: list[int], policy: PolicySettings) -> Chunked:  # fmt: skip
    options = req.body.get("stream_options")
    include_usage = req.stream and isinstance(options, dict) and bool(options.get("include_usage"))
    if (
        req.stream
    ):  # each chunk reports its usage, asked for or not: the merged usage event and the key's quota sum them
        asked = options if isinstance(options, dict) else {}
        bodies = [{**b, "stream_options": {**asked, "include_usage": True}} for b in bodies]
    decision = Decision(Action.CHUNK, plan.prompt_tokens, chunk_tokens=tuple(split.prompt_tokens))
    return Chunked(kind, bodies, costs, decision, req.stream, include_usage, policy, req)

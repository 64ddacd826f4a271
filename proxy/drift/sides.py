"""Each sample counted on both sides: with the guard's own tokenizer and template, and by the upstream (its
`POST /tokenize`, and what a generation is charged)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.registry import GuardedModel
from proxy.drift.compare import Count, Refusal, Row, compare
from proxy.drift.samples import Sample
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.upstream.client import Upstream
from proxy.upstream.remote_count import Reply, chat_tokenize_body, completion_tokenize_body, post_json


async def guard_count(model: GuardedModel, sample: Sample) -> Count:
    raw = json.dumps(sample.body).encode()
    try:
        if sample.kind == "chat":
            return await count_chat(model.tokenizer, parse_chat(raw), model.counter)
        (count,) = await count_completion(model.tokenizer, parse_completion(raw), model.counter)
        return count
    except InvalidRequest as exc:
        return Refusal(exc.message)


def tokenize_body(model: str, sample: Sample) -> dict[str, Any]:
    """The /tokenize request that renders what the chat or completions endpoint would. /tokenize has no `documents`
    or `reasoning_effort` fields, so the template inputs travel as chat_template_kwargs, as vLLM's chat path hands
    them to the template."""
    body = sample.body
    if sample.kind == "completion":
        return completion_tokenize_body(model, body["prompt"], body)
    return chat_tokenize_body(model, body)


def charge_body(model: str, sample: Sample) -> dict[str, Any]:
    """The sample as a real request for one greedy token, whose usage says what vLLM counted. Tools go with
    tool_choice "none" when the sample names no choice: vLLM refuses tools with "auto" unless started with
    --enable-auto-tool-choice, and the choice does not change the prompt."""
    body = {k: v for k, v in sample.body.items() if k not in ("stream", "stream_options", "n", "max_completion_tokens")}
    body.update(model=model, max_tokens=1, temperature=0)
    if sample.kind == "chat" and body.get("tools") and "tool_choice" not in body:
        body["tool_choice"] = "none"
    return body


def charged_result(reply: Reply) -> Count:
    """usage.prompt_tokens of a generation's answer, or what refused it."""
    usage = reply.payload.get("usage") if isinstance(reply.payload, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if reply.status == 200 and isinstance(tokens, int):
        return tokens
    return Refusal(f"{reply.status} {reply.message()}")


def tokenize_result(reply: Reply) -> Count:
    """POST /tokenize's count, or what refused it."""
    count = reply.tokenized()
    return count if count is not None else Refusal(f"{reply.status} {reply.message()}")


async def upstream_count(upstream: Upstream, model: str, sample: Sample) -> Count:
    """The upstream's count; raises GuardError when it cannot be asked at all (unreachable, no /tokenize)."""
    reply = await post_json(upstream, "/tokenize", tokenize_body(model, sample))
    if reply.no_route:
        raise UpstreamUnavailable(f"The upstream at {upstream.where} has no POST /tokenize to compare counts with.")
    return tokenize_result(reply)


async def charged_count(upstream: Upstream, model: str, sample: Sample) -> Count:
    """What vLLM charges for the sample: usage.prompt_tokens of a 1-token generation."""
    path = "/v1/chat/completions" if sample.kind == "chat" else "/v1/completions"
    return charged_result(await post_json(upstream, path, charge_body(model, sample)))


async def count_both(
    model: GuardedModel, samples: Sequence[Sample], upstream: Upstream, charge: bool = True
) -> list[Row]:
    """Every sample counted by the guard, by /tokenize and (with `charge`) by what a generation is charged: the
    reference for every renderer, since /tokenize can differ from generation (a BOS on mistral completions, harmony
    chat rendered with the template, tool conversations refused in mistral mode)."""
    guard = [await guard_count(model, s) for s in samples]
    theirs = [await upstream_count(upstream, model.name, s) for s in samples]
    charged = [await charged_count(upstream, model.name, s) for s in samples] if charge else None
    return compare(model.name, [s.name for s in samples], guard, theirs, charged)

"""Counting each sample on both sides: with the guard's own tokenizer and template, and with the upstream's
`POST /tokenize`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.check.compare import Count, Refusal, Row, compare
from proxy.check.samples import Sample
from proxy.counting.conversation import template_inputs
from proxy.counting.count import count_chat, count_completion
from proxy.counting.registry import GuardedModel
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.upstream.client import Upstream

# Fields of a chat request that /tokenize accepts and that change the rendered prompt (wire contract, section 5).
CHAT_TOKENIZE_FIELDS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
)
JSON_HEADERS = {"content-type": "application/json"}


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
        extra = {"add_special_tokens": body["add_special_tokens"]} if "add_special_tokens" in body else {}
        return {"model": model, "prompt": body["prompt"], **extra}
    fields = {key: body[key] for key in CHAT_TOKENIZE_FIELDS if body.get(key) is not None}
    kwargs = template_inputs(body, body.get("chat_template_kwargs") or {})
    return {"model": model, **fields, **({"chat_template_kwargs": kwargs} if kwargs else {})}


def tokenize_result(status: int, raw: bytes) -> Count:
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    if status == 200 and isinstance(payload, dict) and isinstance(payload.get("count"), int):
        return int(payload["count"])
    return Refusal(f"{status} {_error_message(payload, raw)}")


def _error_message(payload: Any, raw: bytes) -> str:
    if isinstance(payload, dict):
        error = payload.get("error")
        messages = (
            error.get("message") if isinstance(error, dict) else error,
            payload.get("message"),
            payload.get("detail"),
        )
        for message in messages:
            if isinstance(message, str):
                return message
    return raw.decode(errors="replace")[:200]


async def upstream_count(upstream: Upstream, model: str, sample: Sample) -> Count:
    """The upstream's count; raises GuardError when it cannot be asked at all (unreachable, no /tokenize)."""
    body = json.dumps(tokenize_body(model, sample)).encode()
    response = (await upstream.open("POST", "/tokenize", JSON_HEADERS, body)).response
    try:
        raw = await response.read()
    finally:
        response.close()
    if response.status == 404 and raw.strip() == b'{"detail":"Not Found"}':
        raise UpstreamUnavailable(f"The upstream at {upstream.url} has no POST /tokenize to compare counts with.")
    return tokenize_result(response.status, raw)


async def count_both(model: GuardedModel, samples: Sequence[Sample], upstream: Upstream) -> list[Row]:
    guard = [await guard_count(model, s) for s in samples]
    theirs = [await upstream_count(upstream, model.name, s) for s in samples]
    return compare(model.name, [s.name for s in samples], guard, theirs)

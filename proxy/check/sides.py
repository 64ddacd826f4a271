"""Each sample counted on both sides: with the guard's own tokenizer and template, and by the upstream (its
`POST /tokenize`, and what a generation is charged)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.check.compare import Count, Refusal, Row, compare
from proxy.check.samples import Sample
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.registry import GuardedModel
from proxy.errors import InvalidRequest, UpstreamUnavailable
from proxy.upstream.client import Upstream
from proxy.upstream.http import count_bytes
from proxy.upstream.remote_count import chat_tokenize_body

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


def charged_result(status: int, raw: bytes) -> Count:
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if status == 200 and isinstance(tokens, int):
        return tokens
    return Refusal(f"{status} {_error_message(payload, raw)}")


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


async def _post(upstream: Upstream, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
    sent = json.dumps(payload).encode()
    response = (await upstream.open("POST", path, JSON_HEADERS, sent)).response
    try:
        return response.status, await response.read(count_bytes(len(sent)))
    finally:
        response.close()


async def upstream_count(upstream: Upstream, model: str, sample: Sample) -> Count:
    """The upstream's count; raises GuardError when it cannot be asked at all (unreachable, no /tokenize)."""
    status, raw = await _post(upstream, "/tokenize", tokenize_body(model, sample))
    if status == 404 and raw.strip() == b'{"detail":"Not Found"}':
        raise UpstreamUnavailable(f"The upstream at {upstream.url} has no POST /tokenize to compare counts with.")
    return tokenize_result(status, raw)


async def charged_count(upstream: Upstream, model: str, sample: Sample) -> Count:
    """What vLLM charges for the sample: usage.prompt_tokens of a 1-token generation."""
    path = "/v1/chat/completions" if sample.kind == "chat" else "/v1/completions"
    return charged_result(*await _post(upstream, path, charge_body(model, sample)))


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

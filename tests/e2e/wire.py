"""Client-side helpers for the end-to-end tests: prompts of an exact size, vLLM's metrics, SSE normalisation."""

from __future__ import annotations

import re
import time
from typing import Any

from tests.e2e.stack import Stack

GUARD_PROMPT = "x-token-guard-prompt-tokens"
GUARD_MAX = "x-token-guard-max-tokens"
GUARD_ACTION = "x-token-guard-action"

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"


def words(k: int) -> str:
    # One token per word in the DeepSeek BPE, so the count grows by exactly one per word.
    return "hello" + " hello" * (k - 1)


def sized_chat(stack: Stack, tokens: int) -> list[Any]:
    """A one-message conversation that vLLM counts as exactly `tokens` prompt tokens."""
    overhead = stack.tokenize(messages=[{"role": "user", "content": words(10)}]) - 10
    messages = [{"role": "user", "content": words(tokens - overhead)}]
    assert stack.tokenize(messages=messages) == tokens
    return messages


def sized_prompt(stack: Stack, tokens: int) -> str:
    overhead = stack.tokenize(prompt=words(10)) - 10
    prompt = words(tokens - overhead)
    assert stack.tokenize(prompt=prompt) == tokens
    return prompt


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of every sample of `name` whose labels include `labels` (Prometheus text format)."""
    total = 0.0
    for match in re.finditer(rf"^{re.escape(name)}(?:\{{(.*?)\}})? (\S+)$", text, re.MULTILINE):
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        if all(found.get(key) == value for key, value in labels.items()):
            total += float(match.group(2))
    return total


def requests_seen(stack: Stack, route: str, settle: float = 0.5) -> float:
    """How many requests vLLM's HTTP layer received on `route`, whatever their status.

    The counter moves only after vLLM has sent its response, a moment after a client may have seen it; `settle`
    waits that moment out so that "unchanged" really means "never received".
    """
    time.sleep(settle)
    return metric(stack.metrics(), "http_requests_total", handler=route)


def normalise_sse(body: bytes) -> list[bytes]:
    """Split an SSE body into its events with the per-response values (id, created) blanked out.

    The framing is checked on the way: every event is exactly `data: ...` and ends with a blank line.
    """
    assert body.endswith(b"\n\n"), body[-200:]
    events = body[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ") and b"\n" not in event, event[:200]
    blanked = [re.sub(rb'"id":"(chatcmpl|cmpl)-[^"]*"', rb'"id":"\1-ID"', event) for event in events]
    return [re.sub(rb'"created":\d+', b'"created":0', event) for event in blanked]

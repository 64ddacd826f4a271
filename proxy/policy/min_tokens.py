"""Anthropic Messages `min_tokens` (vLLM 0.34: `AnthropicMessagesRequest.min_tokens`, handed to chat's min_tokens and
so to SamplingParams, which refuses one above max_tokens). Earlier releases ignore the field, so the rules here apply
only to an upstream of 0.34 or later:

    refused    above the request's own max_tokens: vLLM's 400, with SamplingParams' message
    lowered    above an output limit the guard lowered: it follows the limit down (as chat's min_tokens, decide.py)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.api.anthropic import MessagesRequest
from proxy.api.body import check_min_tokens, count_field

Follow = Callable[[int], dict[str, Any]]


def checked(req: MessagesRequest) -> int | None:
    """The request's min_tokens as vLLM 0.34 reads it; an InvalidRequest when vLLM would refuse it."""
    min_tokens = count_field(req.body, "min_tokens")
    check_min_tokens(min_tokens, req.max_tokens)
    return min_tokens


def follower(min_tokens: int | None) -> Follow | None:
    """The body field that follows a lowered output limit, or None when min_tokens cannot exceed one."""
    if not min_tokens:
        return None
    return lambda limit: {"min_tokens": limit} if min_tokens > limit else {}


def both(first: Follow | None, second: Follow | None) -> Follow | None:
    """One follower applying both (either may be None)."""
    if first is None or second is None:
        return first or second
    return lambda limit: {**first(limit), **second(limit)}

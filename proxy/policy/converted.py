"""The decision for requests that vLLM renders as chat but that speak another API (Responses, Anthropic Messages):
their prompt is counted as chat, their output limit lives in a field of their own, and their overflow policies work on
their own items.

    pass / clamp / reject   as chat, on `max_output_tokens` (Responses) or `max_tokens` (Messages)
    partial                 Responses with `previous_response_id`: vLLM prepends a stored conversation the guard cannot
                            see; the count is of what the request holds (a lower bound), and the limit is never clamped
                            on that guess; a prompt that already overflows without the stored part is still refused
    truncate                whole turns dropped, oldest first (turns.py)
    chunk                   not applied: the answers of these APIs are not merged (the 400 says so)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.api.body import with_changes
from proxy.errors import ContextLengthExceeded
from proxy.policy.choice import output_reserve
from proxy.policy.decide import Limits, Plan, decide_output
from proxy.policy.outcome import Answer, Decision, Forward, Outcome, Refuse
from proxy.policy.overflow import refuse
from proxy.policy.turns import CountItems, drop_turns, droppable_turns


@dataclass(frozen=True)
class Converted:
    """A request of another API, with what its decision needs to know."""

    endpoint: str  # for the reasons the guard gives
    body: dict[str, Any]
    raw: bytes
    limit_field: str  # the field holding its output limit
    requested: int | None
    param: str  # what a rejection names
    items_field: str  # the field holding its conversation items
    items: list[Any] | str
    starts_turn: Callable[[Any], bool]
    kept: Callable[[Any], bool]
    partial: bool = False  # previous_response_id: part of the prompt is stored upstream
    upstream_truncates: bool = False  # Responses `truncation: "auto"`


async def settle(
    conv: Converted, prompt_tokens: int, limits: Limits, choice: str, recount: CountItems | None
) -> Outcome:
    """What the guard does with it; `recount` counts the request with other items (None: the upstream counted it, so
    cuts cannot be counted exactly and the overflow policies fall back to reject)."""
    plan = decide_output(prompt_tokens, limits, conv.limit_field, conv.requested, conv.param)
    cost = plan.cost(limits, 1)
    if conv.partial:
        if plan.error is not None:
            return refuse(plan, "That is without the stored conversation of previous_response_id, which adds more.")
        body, limit = _key_capped(conv, limits)
        return Forward(body, Decision("partial", prompt_tokens, limit), cost)
    if plan.error is None:
        body = with_changes(conv.body, plan.changes) if plan.changes else conv.raw
        return Forward(body, Decision.of(plan), cost)
    if not isinstance(plan.error, ContextLengthExceeded):  # over the whole KV budget: nothing cut would be admitted
        return Refuse(plan.error, Decision.of(plan))
    if conv.upstream_truncates:  # vLLM cuts the prompt itself, as the client asked
        body, limit = _key_capped(conv, limits)
        return Forward(body, Decision("pass" if body is conv.raw else "clamp", prompt_tokens, limit), cost)
    if choice == "chunk":
        return refuse(plan, f"The chunk policy was not applied: {conv.endpoint} answers cannot be merged.")
    if choice == "truncate" and recount is not None:
        return await _truncate(conv, plan, limits, recount)
    return Refuse(plan.error, Decision.of(plan))


async def _truncate(conv: Converted, plan: Plan, limits: Limits, recount: CountItems) -> Outcome:
    if isinstance(conv.items, str):
        return refuse(plan, f"Truncation could not make it fit: the {conv.items_field} is a single text.")
    budget = limits.max_model_len - output_reserve(conv.requested, limits)
    units = droppable_turns(conv.items, conv.starts_turn, conv.kept)
    cut = await drop_turns(conv.items, units, budget, recount)
    if cut is None:
        return refuse(plan, "Truncation could not make it fit: the system prompt and the last user turn alone are "
                            "too long.")  # fmt: skip
    fitted = decide_output(cut.prompt_tokens, limits, conv.limit_field, conv.requested, conv.param)
    body = with_changes({**conv.body, conv.items_field: cut.items}, fitted.changes)
    decision = Decision("truncate", cut.prompt_tokens, fitted.max_tokens, dropped_messages=cut.dropped,
                        truncated_tokens=plan.prompt_tokens - cut.prompt_tokens)  # fmt: skip
    return Forward(body, decision, fitted.cost(limits, 1))


def _key_capped(conv: Converted, limits: Limits) -> tuple[bytes, int | None]:
    """The body and output limit of a request forwarded without a decision on its room: only the API key's cap
    applies (a cap the key sets, not a guess at what the prompt leaves)."""
    cap = limits.max_output
    if cap is None or (conv.requested is not None and conv.requested <= cap):
        return conv.raw, conv.requested
    return with_changes(conv.body, {conv.limit_field: cap}), cap


def response_turn(item: Any) -> bool:
    """A Responses input item that starts a turn: a user message."""
    return isinstance(item, dict) and item.get("type") in (None, "message") and item.get("role") == "user"


def response_kept(item: Any) -> bool:
    return isinstance(item, dict) and item.get("role") in ("system", "developer")


def message_turn(message: Any) -> bool:
    """An Anthropic message that starts a turn: a user message that is not only tool results."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    return isinstance(content, str) or any(block.get("type") != "tool_result" for block in content)


def message_kept(message: Any) -> bool:
    return bool(message.get("role") == "system")


def count_answer(prompt_tokens: int, limits: Limits) -> Outcome:
    """Anthropic's count_tokens, answered as vLLM answers it: the count, or a 400 for a prompt over the window."""
    if prompt_tokens > limits.max_model_len:
        error = ContextLengthExceeded(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. The prompt is too long: please reduce the length of the messages.",
            param="messages",
        )
        return Refuse(error, Decision("reject", prompt_tokens))
    body = {"input_tokens": prompt_tokens, "context_management": {"original_input_tokens": prompt_tokens}}
    return Answer(json.dumps(body, separators=(",", ":")).encode(), Decision("count", prompt_tokens))

"""The decision for requests that vLLM renders as chat but that speak another API (Responses, Anthropic Messages):
their prompt is counted as chat, their output limit lives in a field of their own, and their overflow policies work on
their own items.

    pass / clamp / reject   as chat, on `max_output_tokens` (Responses) or `max_tokens` (Messages)
    partial                 Responses with `previous_response_id`: vLLM prepends a stored conversation the guard cannot
                            see; the count is of what the request holds (a lower bound), and a limit above the room
                            that bound leaves is clamped to it (it would overflow whatever the stored part holds); a
                            prompt that already overflows without the stored part is still refused
    upstream cut            Responses `truncation: "auto"` with an input over the window: forwarded for vLLM to cut,
                            the limit set to the room a cut prompt keeps for its answer (_cut_upstream)
    truncate                whole turns dropped, oldest first (turns.py)
    chunk                   not applied: the answers of these APIs are not merged (the 400 says so)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, assert_never

from proxy.api.body import with_changes
from proxy.errors import ContextLengthExceeded
from proxy.policy.choice import output_reserve
from proxy.policy.decide import Action, Limits, Plan, decide_output
from proxy.policy.outcome import Answer, Decision, Forward, Outcome, Refuse
from proxy.policy.overflow import refuse
from proxy.policy.turns import CountItems, drop_turns, droppable_turns
from proxy.settings import Overflow


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
    follow: Callable[[int], dict[str, Any]] | None = None  # fields that follow a lowered limit (thinking.py)

    def forwarded(self, changes: dict[str, int], limit: int | None, items: list[Any] | str | None = None) -> bytes:
        """The body to forward: the client's bytes when nothing changes; else with `changes`, the items kept, and
        the fields that follow the output limit."""
        extra = self.follow(limit) if self.follow is not None and limit is not None else {}
        if items is not None:
            extra = {self.items_field: items, **extra}
        if not changes and not extra:
            return self.raw
        return with_changes({**self.body, **extra}, changes)


async def decide(
    conv: Converted, prompt_tokens: int, limits: Limits, choice: str, recount: CountItems | None
) -> Outcome:
    """What the guard does with it; `recount` counts the request with other items (None: the upstream counted it, so
    cuts cannot be counted exactly and the overflow policies fall back to reject)."""
    plan = decide_output(prompt_tokens, limits, conv.limit_field, conv.requested, conv.param)
    cost = plan.cost(limits, 1)
    if plan.error is None:  # a partial count is a lower bound: a limit above the room it leaves overflows anyway
        body = conv.forwarded(plan.changes, plan.max_tokens)
        action = Action.PARTIAL if conv.partial else plan.action
        return Forward(body, Decision(action, prompt_tokens, plan.max_tokens, next_turn=plan.next_turn), cost)
    if not isinstance(plan.error, ContextLengthExceeded):  # over the whole KV budget: nothing cut would be admitted
        return Refuse(plan.error, Decision.of(plan))
    if conv.upstream_truncates:  # vLLM cuts the prompt itself, as the client asked
        return _cut_upstream(conv, prompt_tokens, limits)
    if conv.partial:
        return refuse(plan, "That is without the stored conversation of previous_response_id, which adds more.")
    match Overflow(choice):
        case Overflow.CHUNK:
            return refuse(plan, f"The chunk policy was not applied: {conv.endpoint} answers cannot be merged.")
        case Overflow.TRUNCATE if recount is not None:
            return await _truncate(conv, plan, limits, recount)
        case Overflow.TRUNCATE | Overflow.REJECT:  # a prompt counted upstream: its cuts could not be counted
            return Refuse(plan.error, Decision.of(plan))
        case unhandled:
            assert_never(unhandled)


def _cut_upstream(conv: Converted, prompt_tokens: int, limits: Limits) -> Forward:
    """Responses `truncation: "auto"` with an input over the window: vLLM keeps the input's last tokens, as many as
    the window less the output limit (0.31; 0.32 keeps all but one). So the limit is the room a cut prompt keeps
    for its answer, as for the guard's own cuts: what the request asks for, else default_max_tokens, else a quarter
    of the window; at most half the window (and the key's cap). Its KV cost is the whole window."""
    limit = limits.cap(output_reserve(conv.requested, limits))
    if limit == conv.requested:
        return Forward(conv.raw, Decision(Action.PASS, prompt_tokens, limit), limits.max_model_len)
    body = conv.forwarded({conv.limit_field: limit}, limit)
    return Forward(body, Decision(Action.CLAMP, prompt_tokens, limit), limits.max_model_len)


async def _truncate(conv: Converted, plan: Plan, limits: Limits, recount: CountItems) -> Outcome:
    if isinstance(conv.items, str):
        return refuse(plan, f"Truncation could not make it fit: the {conv.items_field} is a single text.")
    budget = limits.max_model_len - output_reserve(conv.requested, limits)
    units = droppable_turns(conv.items, conv.starts_turn, conv.kept)
    cut = await drop_turns(conv.items, units, budget, recount)
    if cut is None:
        return refuse(plan, "Truncation could not make it fit: the system prompt and the last user turn alone are "
                            "too long.")  # fmt: skip
    # the reserve the cut kept is the answer's: a continuation that overflows is cut again, not kept room for
    fitted = decide_output(cut.prompt_tokens, replace(limits, next_turn=0.0), conv.limit_field, conv.requested,
                           conv.param)  # fmt: skip
    body = conv.forwarded(fitted.changes, fitted.max_tokens, cut.items)
    decision = Decision(Action.TRUNCATE, cut.prompt_tokens, fitted.max_tokens, dropped_messages=cut.dropped,
                        truncated_tokens=plan.prompt_tokens - cut.prompt_tokens)  # fmt: skip
    return Forward(body, decision, fitted.cost(limits, 1))


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


def count_answer(prompt_tokens: int, limits: Limits | None) -> Outcome:
    """Anthropic's count_tokens, answered as vLLM answers it: the count, or a 400 for a prompt over the window
    (`limits`; None: counted whatever the window, as vLLM 0.34 does)."""
    if limits is not None and prompt_tokens > limits.max_model_len:
        error = ContextLengthExceeded(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, your request has "
            f"{prompt_tokens} input tokens. The prompt is too long: please reduce the length of the messages.",
            param="messages",
        )
        return Refuse(error, Decision(Action.REJECT, prompt_tokens))
    body = {"input_tokens": prompt_tokens, "context_management": {"original_input_tokens": prompt_tokens}}
    return Answer(json.dumps(body, separators=(",", ":")).encode(), Decision(Action.COUNT, prompt_tokens))

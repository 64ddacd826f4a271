"""Anthropic extended thinking under an output limit the guard lowered (Claude Code sends `max_tokens: 32000` with
`thinking: {type: enabled, budget_tokens: 16000}` or more, to windows far smaller).

vLLM 0.31/0.32 take an enabled thinking budget only when `1024 <= budget_tokens < max_tokens` (the request model of
`entrypoints/anthropic/protocol.py`: `Field(ge=1024)` and `validate_thinking_budget`), and hand it to the engine as
`thinking_token_budget`. A budget left as sent under a clamped limit is a 400, so the budget follows the limit:

    kept       the limit was not lowered: the budget stays as sent
    lowered    it keeps its share of the output limit (budget * limit // max_tokens), at least vLLM's minimum of 1024;
               always below the limit, since the client's budget was below its max_tokens
    disabled   a limit of 1024 or less leaves no budget vLLM accepts: thinking is turned off for this request
               (`thinking: {type: disabled}`, which renders the prompt differently, so it is counted and decided again)

`x-token-guard-thinking` says which: `budget_tokens=N` or `disabled`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from proxy.api.anthropic import MIN_THINKING_BUDGET, MessagesRequest, thinking_budget
from proxy.policy.outcome import Forward, Outcome

DISABLED = {"type": "disabled"}


def budget_of(req: MessagesRequest) -> int | None:
    """The request's enabled thinking budget; None when thinking is not enabled with one (or vLLM would not check it:
    a prefill leg of disaggregated serving)."""
    thinking, transfer = req.body.get("thinking"), req.body.get("kv_transfer_params")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled" or req.max_tokens is None:
        return None
    if isinstance(transfer, dict) and transfer.get("do_remote_decode"):
        return None
    return thinking_budget(thinking)


def fitted_budget(budget: int, requested: int, limit: int) -> int | None:
    """The budget for an output limit lowered from `requested` to `limit`; None when none that vLLM accepts fits."""
    if limit >= requested:
        return budget
    share = max(MIN_THINKING_BUDGET, budget * limit // requested)
    return share if share < limit else None


def follower(req: MessagesRequest) -> Callable[[int], dict[str, Any]] | None:
    """The body fields that follow a lowered output limit (policy/converted.py applies them), or None when the request
    has no thinking budget to keep within it."""
    budget, requested = budget_of(req), req.max_tokens
    if budget is None or requested is None:
        return None
    thinking = req.body["thinking"]

    def follow(limit: int) -> dict[str, Any]:
        fitted = fitted_budget(budget, requested, limit)
        if fitted is None or fitted == budget:
            return {}
        return {"thinking": {**thinking, "budget_tokens": fitted}}

    return follow


def needs_off(outcome: Outcome, req: MessagesRequest) -> bool:
    """True when the request is to be forwarded with a limit that leaves no thinking budget vLLM accepts."""
    budget = budget_of(req)
    if budget is None or req.max_tokens is None or not isinstance(outcome, Forward):
        return False
    limit = outcome.decision.max_tokens
    return limit is not None and fitted_budget(budget, req.max_tokens, limit) is None


def without_thinking(req: MessagesRequest) -> MessagesRequest:
    return replace(req, body={**req.body, "thinking": DISABLED})


def noted(outcome: Outcome, req: MessagesRequest, disabled: bool) -> Outcome:
    """The outcome with its decision saying what became of the thinking budget, when anything did."""
    if disabled:
        note = "disabled"
    else:
        budget, limit = budget_of(req), outcome.decision.max_tokens
        if budget is None or req.max_tokens is None or limit is None:
            return outcome
        fitted = fitted_budget(budget, req.max_tokens, limit)
        if fitted is None or fitted == budget:
            return outcome
        note = f"budget_tokens={fitted}"
    return replace(outcome, decision=replace(outcome.decision, thinking=note))

"""`thinking_token_budget` under an output limit the guard lowered: chat's and completions' (vLLM 0.31+, decide.py)
and Responses' (vLLM 0.34 adds the field to `ResponsesRequest` and hands it to SamplingParams; 0.33 and earlier
ignore it, and so does the guard in front of them or of an upstream whose version it does not know).

vLLM does not compare the budget with the limit: a budget left as sent under a clamped `max_output_tokens` lets the
reasoning take the whole of the lowered output, and the answer ends incomplete before a word of it. So the budget
keeps its share of the output, as an Anthropic thinking budget does (thinking.py):

    kept       the limit was not lowered, none was sent (the guard's default is no share of the client's), or the
               budget is -1 (unlimited) or not a count (vLLM's 400 is left to vLLM)
    lowered    budget * limit // max_output_tokens, at most the limit
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

FIELD = "thinking_token_budget"


def budget_of(body: dict[str, Any]) -> int | None:
    """The request's thinking budget when it is one to keep within a limit: a count (-1, unlimited, is not)."""
    budget = body.get(FIELD)
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0 else None


def fitted_budget(budget: int, requested: int, limit: int) -> int:
    """The budget for an output limit lowered from `requested` to `limit`."""
    if limit >= requested:
        return budget
    return min(budget * limit // requested, limit)


def followed(body: dict[str, Any], requested: int, limit: int) -> dict[str, int]:
    """The budget field to change for a limit lowered from `requested` to `limit` (chat and completions:
    decide.py); nothing when the budget stays as sent."""
    budget = budget_of(body)
    if budget is None:
        return {}
    fitted = fitted_budget(budget, requested, limit)
    return {} if fitted == budget else {FIELD: fitted}


def follower(body: dict[str, Any], requested: int | None) -> Callable[[int], dict[str, Any]] | None:
    """`followed` for a limit decided later (converted.py applies it), or None when no budget follows."""
    if budget_of(body) is None or requested is None:
        return None
    return lambda limit: followed(body, requested, limit)

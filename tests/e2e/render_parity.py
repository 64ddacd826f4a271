"""What the e2e suite compares of the guard's render answers and real vLLM's: everything but the request id (random
on either side) and the fields docs/llm-d.md lists as not reproduced that vLLM fills here (what a reasoning parser
writes, gpt-oss having one by default; in 0.33+'s parse_context, the tools as vLLM's own models write them)."""

from __future__ import annotations

from typing import Any

UNCOMPARED = ("request_id", "reasoning_ended", "reasoning_parser_kwargs")
PARSE_UNCOMPARED = ("tools",)


def answers(answer: Any) -> list[dict[str, Any]]:
    """A render answer's items: completions answers a list, the other routes one object."""
    return answer if isinstance(answer, list) else [answer]


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    kept = {key: value for key, value in answer.items() if key not in UNCOMPARED}
    if isinstance(kept.get("parse_context"), dict):
        kept["parse_context"] = {k: v for k, v in kept["parse_context"].items() if k not in PARSE_UNCOMPARED}
    return kept

"""The decision for Responses and Anthropic Messages requests: clamp their own limit field, refuse in their terms,
previous_response_id clamped to the room its lower bound leaves,
truncation "auto" left to vLLM with room kept for the answer, truncation by whole turns, and count_tokens answered."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from proxy.policy.converted import (
    Converted,
    count_answer,
    decide,
    message_kept,
    message_turn,
    response_kept,
    response_turn,
)
from proxy.policy.decide import Limits, decide_output
from proxy.policy.outcome import Answer, Forward, Refuse
from proxy.policy.turns import droppable_turns

LIMITS = Limits(max_model_len=100)


def responses(requested: int | None, items: list[Any] | str = "hi", **flags: Any) -> Converted:
    body = {"model": "m", "input": items, **({"max_output_tokens": requested} if requested is not None else {})}
    return Converted("/v1/responses", body, json.dumps(body).encode(), "max_output_tokens", requested, "input",
                     "input", items, response_turn, response_kept, **flags)  # fmt: skip


def test_a_limit_above_the_room_left_is_clamped_in_the_endpoints_own_field() -> None:
    plan = decide_output(60, LIMITS, "max_output_tokens", 1000, "input")
    assert (plan.action, plan.max_tokens, plan.changes) == ("clamp", 40, {"max_output_tokens": 40})


def test_no_limit_is_left_to_the_upstream_unless_a_default_is_configured() -> None:
    assert decide_output(60, LIMITS, "max_tokens", None, "messages").action == "pass"
    plan = decide_output(60, Limits(100, default_max_tokens=50), "max_tokens", None, "messages")
    assert plan.changes == {"max_tokens": 40}


def test_a_prompt_without_room_is_refused_naming_the_endpoints_param() -> None:
    plan = decide_output(100, LIMITS, "max_tokens", 10, "messages")
    assert plan.error is not None and plan.error.param == "messages"
    assert "please reduce the length of the messages" in plan.error.message


def test_clamp_rewrites_only_the_limit_field() -> None:
    outcome = asyncio.run(decide(responses(1000), 60, LIMITS, "reject", None))
    assert isinstance(outcome, Forward)
    assert json.loads(outcome.body) == {"model": "m", "input": "hi", "max_output_tokens": 40}
    assert outcome.decision.action == "clamp" and outcome.cost == 100


def test_a_request_that_fits_is_forwarded_as_sent() -> None:
    conv = responses(10)
    outcome = asyncio.run(decide(conv, 60, LIMITS, "reject", None))
    assert isinstance(outcome, Forward) and outcome.body is conv.raw and outcome.decision.action == "pass"


def test_previous_response_id_is_counted_as_a_lower_bound_and_its_limit_kept_within_the_room_it_leaves() -> None:
    # The stored part can only add tokens: a limit above max_model_len - the lower bound overflows whatever it holds.
    outcome = asyncio.run(decide(responses(1000, partial=True), 60, LIMITS, "reject", None))
    assert isinstance(outcome, Forward)
    assert json.loads(outcome.body)["max_output_tokens"] == 40
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.decision.max_tokens) == ("partial", 60, 40)
    fits = responses(30, partial=True)
    kept = asyncio.run(decide(fits, 60, LIMITS, "reject", None))
    assert isinstance(kept, Forward) and kept.body is fits.raw and kept.decision.action == "partial"
    unsaid = responses(None, partial=True)
    left = asyncio.run(decide(unsaid, 60, LIMITS, "reject", None))
    assert isinstance(left, Forward) and left.body is unsaid.raw and left.decision.max_tokens is None


def test_previous_response_id_that_overflows_without_the_stored_part_is_refused() -> None:
    outcome = asyncio.run(decide(responses(10, partial=True), 120, LIMITS, "reject", None))
    assert isinstance(outcome, Refuse) and "stored conversation" in outcome.error.message


def test_truncation_auto_leaves_the_cut_to_vllm_with_a_limit_that_keeps_room_for_the_answer() -> None:
    # vLLM 0.31 keeps the input's last (window - limit) tokens: the limit is the reserve a cut prompt keeps, what the
    # request asks for up to half the window (a quarter when it asks nothing)
    asked = responses(10, upstream_truncates=True)
    outcome = asyncio.run(decide(asked, 120, LIMITS, "reject", None))
    assert isinstance(outcome, Forward) and outcome.body is asked.raw
    assert (outcome.decision.action, outcome.decision.max_tokens, outcome.cost) == ("pass", 10, 100)
    huge = asyncio.run(decide(responses(100_000, upstream_truncates=True), 120, LIMITS, "reject", None))
    assert isinstance(huge, Forward) and json.loads(huge.body)["max_output_tokens"] == 50
    assert (huge.decision.action, huge.decision.prompt_tokens, huge.decision.max_tokens) == ("clamp", 120, 50)
    unsaid = asyncio.run(decide(responses(None, upstream_truncates=True), 120, LIMITS, "reject", None))
    assert isinstance(unsaid, Forward) and json.loads(unsaid.body)["max_output_tokens"] == 25
    capped = asyncio.run(decide(responses(100_000, upstream_truncates=True), 120, Limits(100, max_output=8), "reject",
                                None))  # fmt: skip
    assert isinstance(capped, Forward) and json.loads(capped.body)["max_output_tokens"] == 8


def test_truncation_auto_with_an_input_that_fits_is_clamped_as_any_request() -> None:
    outcome = asyncio.run(decide(responses(100_000, upstream_truncates=True), 60, LIMITS, "reject", None))
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["max_output_tokens"] == 40


def test_chunk_is_refused_with_the_reason() -> None:
    outcome = asyncio.run(decide(responses(10), 120, LIMITS, "chunk", None))
    assert isinstance(outcome, Refuse) and "chunk policy was not applied" in outcome.error.message


ITEMS = [
    {"role": "developer", "content": "rules"},
    {"role": "user", "content": "first"},
    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c", "output": "out"},
    {"role": "user", "content": "second"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]},
    {"role": "user", "content": "last"},
]


def test_turns_keep_a_call_with_its_output_and_never_the_last_user_turn() -> None:
    assert droppable_turns(ITEMS, response_turn, response_kept) == [[1, 2, 3], [4, 5]]


def test_truncate_drops_the_fewest_oldest_turns_and_recounts() -> None:
    async def count(items: list[Any]) -> int:
        return 20 * len(items)  # 7 items: 140 tokens

    outcome = asyncio.run(decide(responses(10, ITEMS), 140, LIMITS, "truncate", count))
    assert isinstance(outcome, Forward)
    kept = json.loads(outcome.body)["input"]
    assert kept == [ITEMS[0], *ITEMS[4:]]
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.decision.dropped_messages) == (
        "truncate", 80, 3,
    )  # fmt: skip
    assert outcome.decision.truncated_tokens == 60


def test_truncate_refuses_when_the_kept_items_alone_are_too_long() -> None:
    async def count(items: list[Any]) -> int:
        return 200

    outcome = asyncio.run(decide(responses(10, ITEMS), 200, LIMITS, "truncate", count))
    assert isinstance(outcome, Refuse) and "Truncation could not make it fit" in outcome.error.message


def test_anthropic_turns_keep_tool_results_with_their_call() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": "b"},
    ]
    assert droppable_turns(messages, message_turn, message_kept) == [[0, 1, 2]]


def test_count_tokens_is_answered_as_vllm_answers_it() -> None:
    answer = count_answer(100, LIMITS)  # a prompt of exactly the window is counted, not refused
    assert isinstance(answer, Answer) and answer.decision.action == "count"
    assert json.loads(answer.body) == {"input_tokens": 100, "context_management": {"original_input_tokens": 100}}
    refused = count_answer(101, LIMITS)
    assert isinstance(refused, Refuse) and refused.error.status == 400

"""The batch chat decision, without a socket: the shared limit is decided for the longest conversation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.batch import batch_chat_request
from proxy.policy.batch import decide_batch
from proxy.policy.decide import Limits
from proxy.policy.outcome import Forward, Refuse

LIMITS = Limits(max_model_len=100)
HI = [{"role": "user", "content": "hi"}]


def settle(counts: list[int], limits: Limits = LIMITS, choice: str = "reject", **fields: Any) -> Forward | Refuse:
    body = {"messages": [HI] * len(counts), **fields}
    outcome = decide_batch(batch_chat_request(body), counts, json.dumps(body).encode(), limits, choice, "local")
    assert isinstance(outcome, Forward | Refuse)
    return outcome


def test_a_batch_that_fits_passes_as_sent_and_costs_what_it_holds() -> None:
    outcome = settle([10, 30], max_tokens=20)
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["max_tokens"] == 20
    decision = outcome.decision
    assert (decision.action, decision.prompt_tokens, decision.max_tokens) == ("pass", 40, 20)  # vLLM's usage: the sum
    assert outcome.cost == (10 + 20) + (30 + 20)


def test_the_limit_is_clamped_for_the_longest_conversation() -> None:
    outcome = settle([10, 90, 5], max_tokens=50, max_completion_tokens=60, min_tokens=40)
    assert isinstance(outcome, Forward)
    sent = json.loads(outcome.body)
    assert (sent["max_tokens"], sent["max_completion_tokens"], sent["min_tokens"]) == (10, 10, 10)
    assert (outcome.decision.action, outcome.decision.max_tokens, outcome.cost) == ("clamp", 10, 105 + 3 * 10)


def test_with_no_limit_the_upstream_fills_the_window_for_each_conversation() -> None:
    outcome = settle([10, 30])
    assert isinstance(outcome, Forward) and outcome.decision.max_tokens is None and outcome.cost == 2 * 100
    defaulted = settle([10, 30], Limits(100, default_max_tokens=25))
    assert isinstance(defaulted, Forward) and json.loads(defaulted.body)["max_tokens"] == 25
    assert defaulted.cost == 40 + 2 * 25


def test_a_conversation_that_leaves_no_room_refuses_the_batch_and_is_named() -> None:
    outcome = settle([10, 100, 3], max_tokens=5)
    assert isinstance(outcome, Refuse) and outcome.error.param == "messages"
    assert outcome.error.code == "context_length_exceeded"
    assert "That is conversation 1 (messages[1]) of 3." in outcome.error.message
    assert (outcome.decision.action, outcome.decision.prompt_tokens) == ("reject", 113)


@pytest.mark.parametrize("choice", ["truncate", "chunk"])
def test_truncate_and_chunk_are_refused_with_the_reason(choice: str) -> None:
    outcome = settle([100], choice=choice)
    assert isinstance(outcome, Refuse) and f"The {choice} policy was not applied" in outcome.error.message
    assert "That is conversation" not in outcome.error.message  # one conversation: nothing to name


def test_a_batch_over_the_whole_kv_budget_is_clamped_to_fit_it_or_refused() -> None:
    budget = Limits(max_model_len=100, max_cost=120)  # 3 conversations share 120 tokens of KV: 40 each
    outcome = settle([10, 30, 5], budget, max_tokens=50)
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["max_tokens"] == 10
    assert outcome.cost is not None and outcome.cost <= 120
    refused = settle([10, 45, 5], budget, max_tokens=5)
    assert isinstance(refused, Refuse) and refused.error.code == "request_too_large"

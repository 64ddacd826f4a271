"""The Decisions decision, without a socket: a call costs every question's prompt and its one token."""

from __future__ import annotations

import json

from proxy.api.decisions import decision_request
from proxy.policy.decide import Limits
from proxy.policy.decisions import decide_decisions
from proxy.policy.outcome import Findings, Forward, Refuse

BODY = {"model": "m", "input": "x", "questions": [{"type": "predicate", "instructions": "?"}] * 3}


def test_the_call_goes_as_sent_holding_its_fan_out() -> None:
    raw = json.dumps(BODY).encode()
    outcome = decide_decisions(decision_request(BODY), raw, [10, 11, 12], Limits(100), Findings())
    assert isinstance(outcome, Forward) and outcome.body is raw and outcome.cost == 33 + 3
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.decision.max_tokens) == ("pass", 33, 3)


def test_a_fan_out_over_the_kv_budget_is_refused_though_each_question_fits() -> None:
    outcome = decide_decisions(decision_request(BODY), b"", [10, 11, 12], Limits(100, max_cost=35), Findings())
    assert isinstance(outcome, Refuse) and outcome.error.code == "request_too_large"
    assert "36 tokens of KV cache" in outcome.error.message and outcome.decision.action == "reject"

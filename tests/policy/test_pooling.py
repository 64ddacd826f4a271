"""The pooling decision, without a socket: fits at the window, refuses past it whatever the overflow policy (a
pooling answer is about its whole input), counts the client's own truncate_prompt_tokens."""

from __future__ import annotations

import json

import pytest

from proxy.policy.decide import Limits
from proxy.policy.outcome import Forward, Refuse
from proxy.policy.pooling import Pooled, decide_pooling

LIMITS = Limits(max_model_len=100)
BODY = {"model": "m", "input": ["a", "b"]}
RAW = json.dumps(BODY).encode()


def pooled(counts: list[int], truncate: int | None = None, **extra: object) -> Pooled:
    return Pooled("embeddings", BODY, RAW, counts, "input", truncate, **extra)  # type: ignore[arg-type]


def test_a_prompt_of_the_whole_window_passes_as_sent() -> None:
    outcome = decide_pooling(pooled([100, 3]), LIMITS, "reject", "local")
    assert isinstance(outcome, Forward) and outcome.body == RAW
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.cost) == ("pass", 103, 103)
    assert outcome.decision.max_tokens is None


def test_one_prompt_over_the_window_refuses_the_request() -> None:
    outcome = decide_pooling(pooled([3, 101]), LIMITS, "reject", "local")
    assert isinstance(outcome, Refuse) and outcome.error.param == "input"
    assert "contains 101 input tokens" in outcome.error.message and "input 2 of 2" in outcome.error.message


@pytest.mark.parametrize("endpoint", ["embeddings", "pooling", "classify", "score", "rerank"])
@pytest.mark.parametrize("choice", ["truncate", "chunk"])
def test_no_policy_cuts_what_a_pooling_answer_is_about(endpoint: str, choice: str) -> None:
    outcome = decide_pooling(Pooled(endpoint, BODY, RAW, [150, 3], "input", None), LIMITS, choice, "local")
    assert isinstance(outcome, Refuse) and outcome.error.code == "context_length_exceeded"
    assert f"The {choice} policy was not applied: the answer of {endpoint} is about the whole input" in \
        outcome.error.message and "send truncate_prompt_tokens" in outcome.error.message  # fmt: skip


@pytest.mark.parametrize("truncate,action", [(50, "pass"), (-1, "pass"), (120, "reject")])
def test_the_clients_own_truncation_counts(truncate: int, action: str) -> None:
    outcome = decide_pooling(pooled([150], truncate), LIMITS, "reject", "local")
    assert outcome.decision.action == action
    if action == "pass":
        assert outcome.decision.prompt_tokens == min(150, 100 if truncate == -1 else truncate)


def test_score_is_partial_and_not_refused_on_a_guess() -> None:
    # each text fits alone; the pair may not: vLLM decides, whatever the policy (a cut pair scores another pair)
    for choice in ("reject", "truncate"):
        maybe = decide_pooling(pooled([60, 50], partial=True), LIMITS, choice, "local")
        assert isinstance(maybe, Forward) and maybe.body == RAW and maybe.decision.action == "partial"

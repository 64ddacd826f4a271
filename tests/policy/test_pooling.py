"""The pooling decision, without a socket: fits at the window, refuses past it, truncation by vLLM's own -1."""

from __future__ import annotations

import json

import pytest

from proxy.policy.decide import Limits
from proxy.policy.outcome import Forward, Refuse
from proxy.policy.pooling import Pooled, settle_pooling

LIMITS = Limits(max_model_len=100)
BODY = {"model": "m", "input": ["a", "b"]}
RAW = json.dumps(BODY).encode()


def pooled(counts: list[int], truncate: int | None = None, **extra: object) -> Pooled:
    return Pooled("embeddings", BODY, RAW, counts, "input", truncate, **extra)  # type: ignore[arg-type]


def test_a_prompt_of_the_whole_window_passes_as_sent() -> None:
    outcome = settle_pooling(pooled([100, 3]), LIMITS, "reject", "local")
    assert isinstance(outcome, Forward) and outcome.body == RAW
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.cost) == ("pass", 103, 103)
    assert outcome.decision.max_tokens is None


def test_one_prompt_over_the_window_refuses_the_request() -> None:
    outcome = settle_pooling(pooled([3, 101]), LIMITS, "reject", "local")
    assert isinstance(outcome, Refuse) and outcome.error.param == "input"
    assert "contains 101 input tokens" in outcome.error.message and "input 2 of 2" in outcome.error.message


def test_truncate_sets_vllms_own_maximum_and_counts_the_cut() -> None:
    outcome = settle_pooling(pooled([150, 3]), LIMITS, "truncate", "local")
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["truncate_prompt_tokens"] == -1
    decision = outcome.decision
    assert (decision.action, decision.prompt_tokens, decision.truncated_tokens, outcome.cost) == ("truncate", 103, 50,
                                                                                                  103)  # fmt: skip


def test_chunk_is_refused_with_its_reason() -> None:
    outcome = settle_pooling(pooled([150]), LIMITS, "chunk", "local")
    assert isinstance(outcome, Refuse) and "chunk policy was not applied" in outcome.error.message


@pytest.mark.parametrize("truncate,action", [(50, "pass"), (-1, "pass"), (120, "reject")])
def test_the_clients_own_truncation_counts(truncate: int, action: str) -> None:
    outcome = settle_pooling(pooled([150], truncate), LIMITS, "reject", "local")
    assert outcome.decision.action == action
    if action == "pass":
        assert outcome.decision.prompt_tokens == min(150, 100 if truncate == -1 else truncate)


def test_score_is_partial_and_truncate_covers_pairs_that_may_not_fit() -> None:
    fits = settle_pooling(pooled([60, 30], partial=True, paired=90), LIMITS, "truncate", "local")
    assert isinstance(fits, Forward) and fits.body == RAW and fits.decision.action == "partial"
    maybe = settle_pooling(pooled([60, 50], partial=True, paired=110), LIMITS, "truncate", "local")
    assert isinstance(maybe, Forward) and json.loads(maybe.body)["truncate_prompt_tokens"] == -1
    refused = settle_pooling(pooled([60, 50], partial=True, paired=110), LIMITS, "reject", "local")
    assert isinstance(refused, Forward) and refused.body == RAW  # not refused on a guess

"""Anthropic Messages `min_tokens` (vLLM 0.34): refused above the request's max_tokens with SamplingParams' message,
lowered with an output limit the guard lowered below it, alone or beside a thinking budget."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.anthropic import messages_request
from proxy.errors import InvalidRequest
from proxy.policy import thinking
from proxy.policy.min_tokens import both, checked, follower


def request(max_tokens: int = 1000, **extra: Any) -> Any:
    body = {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}], **extra}
    return messages_request(body)


def test_min_tokens_above_max_tokens_is_refused_with_vllms_message() -> None:
    with pytest.raises(InvalidRequest, match=r"min_tokens must be less than or equal to max_tokens=5, got 6\.") as err:
        checked(request(5, min_tokens=6))
    assert err.value.param == "min_tokens"


@pytest.mark.parametrize(("sent", "read"), [(None, None), (0, 0), (5, 5), (5.0, 5)])
def test_min_tokens_within_max_tokens_is_read_as_vllm_reads_it(sent: Any, read: int | None) -> None:
    extra = {} if sent is None else {"min_tokens": sent}
    assert checked(request(5, **extra)) == read


@pytest.mark.parametrize("sent", [-1, "3", 2.5, True])
def test_a_min_tokens_that_is_no_count_is_refused(sent: Any) -> None:
    with pytest.raises(InvalidRequest):
        checked(request(5, min_tokens=sent))


@pytest.mark.parametrize(("least", "limit", "changes"), [(900, 200, {"min_tokens": 200}), (900, 900, {}),
                                                         (100, 200, {})])  # fmt: skip
def test_min_tokens_follows_a_limit_lowered_below_it(least: int, limit: int, changes: dict[str, int]) -> None:
    follow = follower(least)
    assert follow is not None and follow(limit) == changes


def test_no_min_tokens_has_nothing_to_follow() -> None:
    assert follower(None) is None and follower(0) is None


def test_min_tokens_and_a_thinking_budget_both_follow_the_limit() -> None:
    req = request(32000, min_tokens=30000, thinking={"type": "enabled", "budget_tokens": 16000})
    follow = both(thinking.follower(req), follower(checked(req)))
    assert follow is not None
    assert follow(20000) == {"thinking": {"type": "enabled", "budget_tokens": 10000}, "min_tokens": 20000}
    assert both(None, None) is None

"""A thinking budget under a lowered output limit: kept, lowered to its share of the limit (at least vLLM's 1024 and
below the limit), or, where no budget vLLM accepts fits, thinking turned off."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.anthropic import messages_request
from proxy.errors import InvalidRequest
from proxy.policy.outcome import Decision, Forward, Refuse
from proxy.policy.thinking import fitted_budget, follower, needs_off, noted, without_thinking


def request(max_tokens: int = 32000, budget: Any = 16000, **extra: Any) -> Any:
    body = {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": budget}, **extra}  # fmt: skip
    return messages_request(body)


@pytest.mark.parametrize(
    ("budget", "requested", "limit", "fitted"),
    [
        (16000, 32000, 32000, 16000),  # not lowered: as sent
        (16000, 32000, 20000, 10000),  # half of the output, as the client asked
        (16000, 32000, 2044, 1024),  # its share (1022) is under vLLM's minimum: the minimum
        (31999, 32000, 5000, 4999),  # Claude Code's largest budget: always below the limit
        (16000, 32000, 1025, 1024),
        (16000, 32000, 1024, None),  # budget < max_tokens cannot hold with 1024 <= budget
        (16000, 32000, 1, None),
    ],
)
def test_the_budget_keeps_its_share_of_a_lowered_limit(budget: int, requested: int, limit: int, fitted: int) -> None:
    assert fitted_budget(budget, requested, limit) == fitted
    if fitted is not None:
        assert 1024 <= fitted < limit


def test_the_follower_rewrites_only_a_budget_that_changes() -> None:
    follow = follower(request(display="omitted"))
    assert follow is not None
    assert follow(32000) == {} and follow(1024) == {}
    assert follow(2044) == {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert follower(messages_request({"model": "m", "max_tokens": 5, "messages": []})) is None
    remote = request(kv_transfer_params={"do_remote_decode": True}, max_tokens=2)
    assert follower(remote) is None  # vLLM does not check the budget of a prefill leg


def test_a_limit_with_no_room_for_a_budget_turns_thinking_off() -> None:
    req = request()
    clamped = Forward(b"{}", Decision("clamp", 1200, 848))
    assert needs_off(clamped, req)
    assert not needs_off(Forward(b"{}", Decision("clamp", 10, 2038)), req)
    assert not needs_off(Refuse(InvalidRequest("x"), Decision("reject", 3000)), req)
    off = without_thinking(req)
    assert off.body["thinking"] == {"type": "disabled"} and req.body["thinking"]["type"] == "enabled"
    assert noted(clamped, req, disabled=True).decision.headers()["x-token-guard-thinking"] == "disabled"


def test_the_header_says_the_budget_forwarded() -> None:
    req = request()
    lowered = noted(Forward(b"{}", Decision("clamp", 4, 2044)), req, disabled=False)
    assert lowered.decision.headers()["x-token-guard-thinking"] == "budget_tokens=1024"
    kept = noted(Forward(b"{}", Decision("pass", 4, 32000)), req, disabled=False)
    assert "x-token-guard-thinking" not in kept.decision.headers()


@pytest.mark.parametrize(("budget", "says"), [(1000, "at least 1024"), ("many", "at least 1024"), (None, "1024")])
def test_a_budget_vllm_refuses_is_a_400(budget: Any, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says) as caught:
        request(budget=budget)
    assert caught.value.param == "thinking.budget_tokens"
    with pytest.raises(InvalidRequest, match="less than max_tokens"):
        request(max_tokens=2000, budget=2000)
    assert json.dumps(request(budget=1024.0).body)  # a whole float is an integer to vLLM's pydantic

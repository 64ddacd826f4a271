"""The pure decision: pass, clamp or reject, and which fields change."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy import error_bodies
from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.policy.decide import Limits, decide_chat, decide_completion
from proxy.policy.outcome import Decision

M = 2048


def chat(**fields: Any) -> Any:
    return parse_chat(json.dumps({"messages": [{"role": "user", "content": "x"}], **fields}).encode())


def completion(**fields: Any) -> Any:
    return parse_completion(json.dumps({"prompt": "x", **fields}).encode())


def test_request_that_fits_passes_unchanged() -> None:
    plan = decide_chat(chat(max_tokens=100), 1000, Limits(M))
    assert (plan.action, plan.changes, plan.max_tokens) == ("pass", {}, 100)


def test_max_tokens_is_clamped_to_the_room_left() -> None:
    plan = decide_chat(chat(max_tokens=2000), 100, Limits(M))
    assert (plan.action, plan.changes, plan.max_tokens) == ("clamp", {"max_tokens": 1948}, 1948)


def test_max_completion_tokens_wins_and_every_sent_field_that_overflows_is_rewritten() -> None:
    plan = decide_chat(chat(max_tokens=5000, max_completion_tokens=3000), 100, Limits(M))
    assert plan.changes == {"max_tokens": 1948, "max_completion_tokens": 1948}
    only_other = decide_chat(chat(max_tokens=10, max_completion_tokens=3000), 100, Limits(M))
    assert only_other.changes == {"max_completion_tokens": 1948} and only_other.max_tokens == 1948


def test_exact_fit_is_not_clamped() -> None:
    assert decide_chat(chat(max_tokens=48), 2000, Limits(M)).action == "pass"
    assert decide_chat(chat(max_tokens=49), 2000, Limits(M)).changes == {"max_tokens": 48}


def test_min_tokens_is_lowered_with_the_clamp() -> None:
    plan = decide_chat(chat(max_tokens=500, min_tokens=400), 1800, Limits(M))
    assert plan.changes == {"max_tokens": 248, "min_tokens": 248}


def test_chat_without_a_limit_is_left_to_the_upstream_unless_a_default_is_set() -> None:
    assert decide_chat(chat(), 100, Limits(M)).action == "pass"
    assert decide_chat(chat(), 100, Limits(M)).max_tokens is None
    assert decide_chat(chat(), 100, Limits(M, default_max_tokens=256)).changes == {"max_tokens": 256}
    half = decide_chat(chat(), 100, Limits(M, default_max_tokens="50%"))
    assert half.changes == {"max_tokens": 1024} and half.action == "clamp"
    tight = decide_chat(chat(), 2000, Limits(M, default_max_tokens="50%"))
    assert tight.changes == {"max_tokens": 48}


@pytest.mark.parametrize("prompt_tokens,min_output,action", [(2047, 1, "pass"), (2048, 1, "reject"),
                                                             (3000, 1, "reject"), (2000, 64, "reject"),
                                                             (1984, 64, "pass")])  # fmt: skip
def test_reject_when_room_is_below_min_output_tokens(prompt_tokens: int, min_output: int, action: str) -> None:
    plan = decide_chat(chat(max_tokens=1), prompt_tokens, Limits(M, min_output_tokens=min_output))
    assert plan.action == action


def test_reject_error_is_what_sdk_fallbacks_look_for() -> None:
    plan = decide_chat(chat(max_tokens=10), 3000, Limits(M))
    assert plan.error is not None
    body = error_bodies.body(plan.error)["error"]
    assert "maximum context length is 2048 tokens" in body["message"]
    assert "3000 input tokens" in body["message"]
    assert (body["type"], body["param"], body["code"]) == ("BadRequestError", "messages", "context_length_exceeded")
    assert plan.error.status == 400
    assert Decision.of(plan).headers()["x-token-guard-action"] == "reject"


def test_completions_default_of_16_is_clamped_by_adding_the_field() -> None:
    assert decide_completion(completion(), [100], Limits(M)).action == "pass"
    assert decide_completion(completion(), [100], Limits(M)).max_tokens == 16
    plan = decide_completion(completion(), [2040], Limits(M))
    assert plan.changes == {"max_tokens": 8}


def test_completion_batch_is_clamped_for_its_longest_prompt() -> None:
    plan = decide_completion(completion(max_tokens=1000), [100, 1500, 700], Limits(M))
    assert (plan.prompt_tokens, plan.changes) == (1500, {"max_tokens": 548})
    error = decide_completion(completion(), [100, 2048], Limits(M)).error
    assert error is not None and error.param == "prompt"


def test_headers_say_what_happened() -> None:
    plan = decide_chat(chat(max_tokens=2000), 100, Limits(M))
    assert Decision.of(plan).headers() == {
        "x-token-guard-prompt-tokens": "100",
        "x-token-guard-action": "clamp",
        "x-token-guard-max-tokens": "1948",
    }


def test_an_api_keys_output_cap_clamps_like_the_window() -> None:
    capped = Limits(M, max_output=64)
    assert decide_chat(chat(max_tokens=100), 100, capped).changes == {"max_tokens": 64}
    assert decide_chat(chat(max_tokens=10), 100, capped).action == "pass"
    assert decide_chat(chat(max_tokens=100), 2000, capped).changes == {"max_tokens": 48}  # the room is smaller
    unsaid = decide_chat(chat(), 100, capped)  # a request without a limit gets the cap, not the window
    assert (unsaid.action, unsaid.changes, unsaid.cost(capped, 1)) == ("clamp", {"max_tokens": 64}, 164)
    with_default = decide_chat(chat(), 100, Limits(M, default_max_tokens=32, max_output=64))
    assert with_default.changes == {"max_tokens": 32}
    assert decide_completion(completion(), [10], Limits(M, max_output=8)).changes == {"max_tokens": 8}
    assert decide_chat(chat(max_tokens=5), 2048, capped).action == "reject"  # the cap makes no room


def test_a_request_over_the_whole_kv_budget_is_clamped_to_fit_it() -> None:
    budget = Limits(M, max_cost=16384)  # the case: n 16 x (4 + 2000) = 32,064 tokens of KV
    plan = decide_chat(chat(max_tokens=2000, n=16), 4, budget)
    assert (plan.action, plan.changes, plan.max_tokens) == ("clamp", {"max_tokens": 1020}, 1020)
    assert plan.cost(budget, 16) <= 16384
    assert decide_chat(chat(max_tokens=2000), 4, budget).action == "pass"  # one sequence fits the budget


def test_without_an_output_limit_the_budget_sets_one() -> None:
    budget = Limits(M, max_cost=4096)
    plan = decide_chat(chat(n=4), 24, budget)  # vLLM would fill the window: 4 x 2048 > 4096
    assert (plan.action, plan.changes) == ("clamp", {"max_tokens": 1000})
    assert decide_chat(chat(), 24, Limits(M, max_cost=8192)).action == "pass"  # the window itself fits


def test_a_prompt_alone_over_the_budget_is_refused_outright() -> None:
    plan = decide_chat(chat(max_tokens=10, n=8), 600, Limits(M, max_cost=4096))
    assert plan.action == "reject" and plan.error is not None
    assert (plan.error.code, plan.error.param) == ("request_too_large", "messages")
    assert "4096" in plan.error.message and "admission.max_inflight_tokens" in plan.error.message
    batch = decide_completion(completion(prompt=["a", "b", "c"], max_tokens=10), [1500, 1, 1], Limits(M, max_cost=4000))
    assert batch.action == "reject" and batch.error is not None and batch.error.code == "request_too_large"

"""The token-in generate decision, without a socket: the chat rules on sampling_params."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.tokens import generate_request
from proxy.policy.decide import Limits
from proxy.policy.generate import decide_generate
from proxy.policy.outcome import Forward, Refuse

LIMITS = Limits(max_model_len=100)


def settle(prompt: int, sampling: dict[str, Any], limits: Limits = LIMITS, choice: str = "reject",
           **extra: Any) -> Forward | Refuse:  # fmt: skip
    body = {"token_ids": [7] * prompt, "sampling_params": sampling, "model": "m", **extra}
    outcome = decide_generate(generate_request(body), json.dumps(body).encode(), limits, choice)
    assert isinstance(outcome, Forward | Refuse)
    return outcome


def sent(outcome: Forward | Refuse) -> dict[str, Any]:
    assert isinstance(outcome, Forward)
    sampling: dict[str, Any] = json.loads(outcome.body)["sampling_params"]
    return sampling


def test_a_limit_that_fits_passes_as_sent() -> None:
    outcome = settle(10, {"max_tokens": 5, "temperature": 0, "n": 2})
    assert isinstance(outcome, Forward) and outcome.decision.action == "pass"
    assert (outcome.decision.prompt_tokens, outcome.decision.max_tokens, outcome.cost) == (10, 5, 2 * 15)


def test_a_limit_over_the_room_is_clamped_in_sampling_params_with_min_tokens() -> None:
    outcome = settle(90, {"max_tokens": 50, "min_tokens": 30, "temperature": 0.5}, request_id="r")
    assert sent(outcome) == {"max_tokens": 10, "min_tokens": 10, "temperature": 0.5}
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["request_id"] == "r"
    assert (outcome.decision.action, outcome.decision.max_tokens, outcome.cost) == ("clamp", 10, 100)


def test_no_limit_is_left_to_vllm_unless_a_default_or_the_keys_cap_says_one() -> None:
    outcome = settle(10, {})
    assert isinstance(outcome, Forward) and outcome.decision.max_tokens is None and outcome.cost == 100
    assert sent(settle(10, {}, Limits(100, default_max_tokens=20))) == {"max_tokens": 20}
    assert sent(settle(10, {"max_tokens": None}, Limits(100, max_output=7))) == {"max_tokens": 7}


@pytest.mark.parametrize("prompt", [100, 101])
def test_a_prompt_that_leaves_no_room_is_refused(prompt: int) -> None:
    outcome = settle(prompt, {"max_tokens": 1})
    assert isinstance(outcome, Refuse) and outcome.error.param == "token_ids"
    assert f"your request has {prompt} input tokens" in outcome.error.message
    truncated = settle(prompt, {"max_tokens": 1}, choice="truncate")
    assert isinstance(truncated, Refuse) and "truncate policy was not applied" in truncated.error.message


def test_media_makes_it_partial_and_never_clamped_on_the_guess() -> None:
    parts = [{"type": "image_url", "url": "https://x/a.png"}]
    outcome = settle(90, {"max_tokens": 50}, content_parts=parts)
    assert isinstance(outcome, Forward) and sent(outcome) == {"max_tokens": 50}
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.cost) == ("partial", 90, 140)
    capped = settle(10, {"max_tokens": 50}, Limits(100, max_output=8), content_parts=parts)
    assert sent(capped) == {"max_tokens": 8} and capped.decision.max_tokens == 8
    refused = settle(100, {"max_tokens": 5}, content_parts=parts)
    assert isinstance(refused, Refuse) and "without the media of content_parts" in refused.error.message


def test_n_sequences_over_the_whole_kv_budget_are_clamped_to_fit_it() -> None:
    outcome = settle(10, {"max_tokens": 80, "n": 4}, Limits(max_model_len=100, max_cost=200))
    assert sent(outcome)["max_tokens"] == 40 and isinstance(outcome, Forward) and outcome.cost == 200

"""Which overflow policy applies (config, per-request header, override switch) and the room kept for the answer."""

from __future__ import annotations

import pytest

from proxy.errors import InvalidRequest
from proxy.policy.choice import choose_policy, output_reserve, whole_prompt
from proxy.policy.decide import Limits
from proxy.settings import PolicySettings


def test_policy_comes_from_config_unless_the_client_asks() -> None:
    policy = PolicySettings(on_overflow="truncate")
    assert choose_policy(policy, {}) == "truncate"
    assert choose_policy(policy, {"x-token-guard-overflow": " Chunk "}) == "chunk"


def test_unknown_policy_header_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidRequest, match="must be one of reject, truncate, chunk; got 'split'"):
        choose_policy(PolicySettings(), {"x-token-guard-overflow": "split"})


def test_client_override_can_be_switched_off() -> None:
    policy = PolicySettings(allow_client_override=False)
    with pytest.raises(InvalidRequest, match="does not let clients choose"):
        choose_policy(policy, {"x-token-guard-overflow": "chunk"})
    assert choose_policy(policy, {"x-token-guard-overflow": "reject"}) == "reject"


def test_output_reserve_is_the_request_capped_at_half_the_window() -> None:
    limits = Limits(2048, min_output_tokens=4)
    assert output_reserve(100, limits) == 100
    assert output_reserve(5000, limits) == 1024
    assert output_reserve(None, limits) == 512  # nothing asked: a quarter of the window, not 1 token
    assert output_reserve(None, Limits(2048, default_max_tokens="10%")) == 204


@pytest.mark.parametrize(
    "body,why",
    [({"prompt": "x", "echo": True, "logprobs": 1}, "echo with logprobs"),
     ({"prompt": "x", "echo": True, "logprobs": 0}, "echo with logprobs"),
     ({"prompt": "x", "prompt_logprobs": 0}, "prompt_logprobs"),
     ({"messages": [], "prompt_logprobs": 5}, "prompt_logprobs"),
     ({"prompt": "x", "prompt_embeds": "UEsD"}, "prompt_embeds"),
     ({"prompt": "x", "prompt_embeds": ["UEsD"]}, "prompt_embeds"),
     ({"messages": [], "kv_transfer_params": {"prompt_token_ids": [1]}}, "in place of the messages")],
)  # fmt: skip
def test_requests_about_their_own_prompt_are_kept_whole(body: dict[str, object], why: str) -> None:
    reason = whole_prompt(body)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "body",
    [{"prompt": "x"}, {"prompt": "x", "echo": True}, {"prompt": "x", "logprobs": 1},
     {"messages": [], "logprobs": True, "top_logprobs": 5}, {"prompt": "x", "prompt_embeds": []},
     {"prompt": "x", "prompt_logprobs": None, "prompt_embeds": None},
     {"messages": [], "kv_transfer_params": {"do_remote_decode": True}}],
)  # fmt: skip
def test_other_requests_take_the_policy(body: dict[str, object]) -> None:
    assert whole_prompt(body) is None

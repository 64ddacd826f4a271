"""What vLLM keeps of a prompt whose request sets truncate_prompt_tokens (vLLM's TokenizeParams._truncation_slice)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.policy.client_cut import ClientCut, Rules, client_cut, held_back


@pytest.mark.parametrize(
    ("keep", "tokens", "held", "kept"),
    [
        (100, 500, 1, 100),  # cut to what was asked
        (100, 40, 1, 40),  # a shorter prompt stays whole
        (0, 40, 1, 0),
        (-1, 500, 1, 255),  # up to the window, one token held back for the output
        (-1, 500, 0, 256),  # 0.32 with no output limit: the whole window
        (-1, 500, 50, 206),  # 0.31: the window less the output limit
        (-1, 200, 1, 200),
    ],
)
def test_kept_is_what_vllm_runs(keep: int, tokens: int, held: int, kept: int) -> None:
    assert ClientCut(keep, None).kept(tokens, 256, held) == kept


@pytest.mark.parametrize(
    ("requested", "rules", "held"),
    [
        (50, Rules.RESERVES, 50),
        (None, Rules.RESERVES, 0),
        (50, Rules.ONE_IF_LIMITED, 1),
        (None, Rules.ONE_IF_LIMITED, 0),
        (0, Rules.ONE_IF_LIMITED, 0),
        (50, Rules.ONE_UNLESS_ZERO, 1),
        (None, Rules.ONE_UNLESS_ZERO, 1),
        (0, Rules.ONE_UNLESS_ZERO, 0),
    ],
)
def test_minus_one_holds_back_what_each_release_holds_back(requested: int | None, rules: Rules, held: int) -> None:
    assert held_back(requested, rules) == held


def test_a_cut_longer_than_the_window_is_refused_as_vllm_refuses_it() -> None:
    ClientCut(256, None).check(256)
    with pytest.raises(InvalidRequest, match="truncate_prompt_tokens=257 cannot be greater than max_model_len = 256"):
        ClientCut(257, None).check(256)


@pytest.mark.parametrize(
    "body",
    [{"truncate_prompt_tokens": -2}, {"truncate_prompt_tokens": 1.5}, {"truncate_prompt_tokens": True},
     {"truncate_prompt_tokens": 10, "truncation_side": "both"}],
)  # fmt: skip
def test_values_vllm_refuses_are_refused(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        client_cut(body)


def test_no_cut_asked() -> None:
    assert client_cut({"max_tokens": 5}) is None
    assert client_cut({"truncate_prompt_tokens": 7, "truncation_side": "right"}) == ClientCut(7, "right")
    assert client_cut({"truncate_prompt_tokens": 7.0}) == ClientCut(7, None)  # pydantic's lax int

"""What vLLM keeps of a prompt whose request sets truncate_prompt_tokens (vLLM's TokenizeParams._truncation_slice)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import InvalidRequest
from proxy.policy.client_cut import ClientCut, client_cut, holds_one


@pytest.mark.parametrize(
    ("keep", "tokens", "holds", "kept"),
    [
        (100, 500, True, 100),  # cut to what was asked
        (100, 40, True, 40),  # a shorter prompt stays whole
        (0, 40, True, 0),
        (-1, 500, True, 255),  # up to the window, one token held back for the output
        (-1, 500, False, 256),  # 0.32 with no output limit: the whole window
        (-1, 200, True, 200),
    ],
)
def test_kept_is_what_vllm_runs(keep: int, tokens: int, holds: bool, kept: int) -> None:
    assert ClientCut(keep, None).kept(tokens, 256, holds) == kept


@pytest.mark.parametrize(
    ("requested", "unlimited", "holds"), [(50, False, True), (0, True, False), (None, False, False), (None, True, True)]
)
def test_minus_one_holds_a_token_back_for_an_output_limit_and_on_0_33_without_one(
    requested: int | None, unlimited: bool, holds: bool
) -> None:
    assert holds_one(requested, unlimited) is holds


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

"""Responses `thinking_token_budget` (vLLM 0.34) under a lowered `max_output_tokens`: it keeps its share of the
output, at most the limit; kept when the limit was not lowered, none was sent, or it is -1 (unlimited)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.policy.token_budget import budget_of, fitted_budget, follower


@pytest.mark.parametrize(
    ("budget", "requested", "limit", "fitted"),
    [
        (500, 1000, 1000, 500),  # not lowered: as sent
        (500, 1000, 200, 100),  # half of the output, as the client asked
        (0, 1000, 200, 0),  # no thinking stays none
        (5000, 1000, 200, 200),  # a budget over the whole output may still take all of it, no more
        (999, 1000, 1, 0),
    ],
)
def test_the_budget_keeps_its_share_of_a_lowered_limit(budget: int, requested: int, limit: int, fitted: int) -> None:
    assert fitted_budget(budget, requested, limit) == fitted
    assert fitted <= limit or limit >= requested


@pytest.mark.parametrize(("sent", "read"), [(None, None), (-1, None), (True, None), (2.5, None), ("9", None), (0, 0),
                                            (7, 7)])  # fmt: skip
def test_only_a_count_is_a_budget_to_keep_within_the_limit(sent: Any, read: int | None) -> None:
    assert budget_of({} if sent is None else {"thinking_token_budget": sent}) == read


def test_the_follower_lowers_only_a_budget_the_limit_binds() -> None:
    follow = follower({"thinking_token_budget": 500}, 1000)
    assert follow is not None
    assert follow(200) == {"thinking_token_budget": 100}
    assert follow(1000) == {}


def test_nothing_follows_without_a_budget_or_a_limit_sent() -> None:
    assert follower({}, 1000) is None
    assert follower({"thinking_token_budget": -1}, 1000) is None
    assert follower({"thinking_token_budget": 500}, None) is None

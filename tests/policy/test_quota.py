"""Per-key token buckets (pure): charged in both buckets or neither, refilled at the limit per minute, a reservation
above the whole limit refused, work already done taken into debt, OpenAI's header formats."""

from __future__ import annotations

import pytest

from proxy.policy.quota import CHECK, TAKE, Bucket, LocalQuotas, Verdict, Window, charge, duration, give_back

T0 = 1_000_000.0


def test_a_key_spends_its_minute_then_waits_for_the_refill() -> None:
    quotas = LocalQuotas()
    first = quotas.charge("a", (1000, None), 600, T0)
    assert first.allowed and first.tokens == Window(1000, 400, 36_000) and first.requests is None
    refused = quotas.charge("a", (1000, None), 600, T0)
    assert not refused.allowed and refused.tokens == Window(1000, 400, 36_000)  # nothing taken
    assert refused.retry_after_ms == 12_000  # 200 tokens at 1000 per minute
    assert quotas.charge("a", (1000, None), 600, T0 + 12_000).allowed
    assert quotas.charge("b", (1000, None), 1000, T0).allowed  # each key has its own buckets


def test_both_buckets_or_neither() -> None:
    quotas = LocalQuotas()
    assert quotas.charge("a", (1000, 2), 10, T0).allowed
    assert quotas.charge("a", (1000, 2), 10, T0).allowed
    third = quotas.charge("a", (1000, 2), 10, T0)
    assert not third.allowed and third.requests == Window(2, 0, 60_000)
    assert third.tokens is not None and third.tokens.remaining == 980  # the refused request took no tokens
    assert third.retry_after_ms == 30_000  # one request at 2 per minute


def test_a_reservation_above_the_whole_limit_is_refused_outright_and_leaves_no_debt() -> None:
    tokens, requests = Bucket(1000.0, T0), Bucket(5.0, T0)
    refused = charge((tokens, 1000), (requests, 5), 2500, T0)
    assert not refused.allowed and refused.too_large
    assert (tokens.level, requests.level) == (1000.0, 5.0)  # nothing taken: not a request either
    assert charge((tokens, 1000), (requests, 5), 1000, T0).allowed  # the whole limit, once full, is fine


def test_work_already_done_is_taken_whole_into_debt_if_the_key_had_something_left() -> None:
    tokens, requests = Bucket(10.0, T0), Bucket(1.0, T0)
    counted = charge((tokens, 1000), (requests, 60), 2500, T0, TAKE)  # a count of 2,500 tokens, answered
    assert counted.allowed and not counted.too_large
    assert (tokens.level, requests.level) == (-2490.0, 0.0)
    again = charge((tokens, 1000), (requests, 60), 5, T0 + 60_000, TAKE)  # a minute refills 1000: still in debt
    assert (
        not again.allowed and again.retry_after_ms == 89_460
    )  # until one token is there again: 1,491 at 1000 a minute
    assert tokens.level == -1490.0  # refused: nothing taken


def test_a_check_charges_nothing_and_needs_one_token_and_one_request() -> None:
    tokens, requests = Bucket(0.5, T0), Bucket(3.0, T0)
    looked = charge((tokens, 600), (requests, 60), 0, T0, CHECK)
    assert not looked.allowed and looked.retry_after_ms == 50  # half a token at 10 a second
    assert charge((tokens, 600), (requests, 60), 0, T0 + 50, CHECK).allowed
    assert (tokens.level, requests.level) == (1.0, 3.05)


def test_give_back_returns_what_was_not_used_up_to_the_limit() -> None:
    tokens = Bucket(1000.0, T0)
    charge((tokens, 1000), None, 800, T0)
    give_back(tokens, 1000, 700, T0)
    assert tokens.level == 900.0
    give_back(tokens, 1000, 5000, T0)
    assert tokens.level == 1000.0
    give_back(tokens, 1000, -300, T0)  # used more than it reserved
    assert tokens.level == 700.0


def test_workers_each_hold_their_share() -> None:
    verdict = LocalQuotas(share=4).charge("a", (1000, 10), 1, T0)
    assert verdict.tokens is not None and verdict.tokens.limit == 250
    assert verdict.requests is not None and verdict.requests.limit == 2


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0ms"), (20, "20ms"), (999, "999ms"), (1000, "1s"), (1500, "1.5s"), (60_000, "1m0s"), (360_000, "6m0s"),
     (90_250, "1m30.25s")],
)  # fmt: skip
def test_reset_in_openai_format(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_headers_are_openais() -> None:
    verdict = Verdict(True, Window(1000, 400, 36_000), Window(60, 59, 1000))
    assert verdict.headers() == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "400",
        "x-ratelimit-reset-tokens": "36s",
    }
    assert Verdict(False, None, None, 1).retry_after_s == 1 and Verdict(False, None, None, 1001).retry_after_s == 2


def test_a_process_without_redis_starts_from_its_share_of_what_redis_last_said() -> None:
    """Two processes shared a 3,000-token key in Redis, which last said 1,000 were left: each now holds 500 of its
    1,500, and 5 of the 10 requests left."""
    local = LocalQuotas(2)
    said = Verdict(True, Window(3000, 1000, 40_000), Window(60, 10, 50_000))
    local.mirror("team", (3000, 60), said, 0)
    assert not local.charge("team", (3000, 60), 501, 0).allowed
    assert local.charge("team", (3000, 60), 500, 0).allowed
    local.share = 3  # a third process came and went: never more than the new share's limit
    assert local.peek("team", (3000, 60), 60_000).tokens == Window(1000, 1000, 0)

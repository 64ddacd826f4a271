"""The bytes of request bodies a process holds at once: a body's share grows with what has arrived, never counted
twice, comes back whole when its request is done; a declared length that does not fit is refused before a byte is
read, without holding anything; and one that does not fit is a 503 that says when to try again."""

from __future__ import annotations

import pytest

from proxy import error_bodies
from proxy.errors import GuardUnavailable
from proxy.exchange.bodies import BodyBudget


def test_a_share_grows_to_what_arrived_and_comes_back_whole() -> None:
    budget = BodyBudget(1000)
    declared, chunked = budget.hold(), budget.hold()
    declared.check(600)  # its declared length fits: nothing is held for it before a byte is read
    assert budget.held == 0
    for arrived in (100, 300, 600):  # its pieces, within what it declared
        declared.grow(arrived)
    chunked.grow(150)
    chunked.grow(400)  # no declared length: what has arrived so far
    assert budget.held == 1000
    declared.release()
    assert budget.held == 400
    chunked.release()
    chunked.release()  # a second release gives nothing back twice
    assert budget.held == 0


def test_a_body_that_does_not_fit_is_a_503_with_retry_after_and_takes_nothing() -> None:
    budget = BodyBudget(1000)
    budget.hold().grow(700)
    late = budget.hold()
    late.grow(200)
    with pytest.raises(GuardUnavailable) as refused:
        late.grow(400)  # its next piece would take the process past its bound
    assert budget.held == 900 and late.size == 200
    headers, body = error_bodies.answer(refused.value)
    assert refused.value.status == 503 and (b"retry-after", b"1") in headers
    assert b'"code":"server_busy"' in body and b"server.max_held_body_bytes" in body
    late.release()
    assert budget.held == 700


def test_a_declared_length_that_does_not_fit_is_refused_before_a_byte_and_holds_nothing() -> None:
    budget = BodyBudget(1000)
    slow = budget.hold()
    slow.check(900)  # declares most of the room, then sends a trickle: it holds the trickle
    slow.grow(10)
    budget.hold().check(990)  # so another body of all the rest still fits
    late = budget.hold()
    late.grow(500)
    with pytest.raises(GuardUnavailable):
        budget.hold().check(491)  # 510 held: 491 more would not fit
    late.check(990)  # a body's own bytes are not counted twice against it
    assert budget.held == 510

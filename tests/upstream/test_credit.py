"""Credit in blocks, without Redis: how big a block is, what fits in it, and what it should hold as requests come,
stop, or others want budget."""

from __future__ import annotations

import pytest

from proxy.upstream.admission import Budget
from proxy.upstream.credit import IDLE_S, WANTED_S, Block, block_size, pick


@pytest.mark.parametrize(
    ("whole", "share", "instances", "size"),
    [
        (Budget(1000), 0.5, 1, (500, 1)),  # no request budget: one slot, a marker that the replica is busy
        (Budget(1000), 0.5, 4, (125, 1)),  # the share is divided among the processes sharing the budget
        (Budget(1000), 0.5, 0, (500, 1)),  # before the first heartbeat: this process alone
        (Budget(1000, 8), 0.5, 2, (250, 2)),
        (Budget(0, 8), 0.5, 2, (0, 2)),  # a request budget only: slots, no tokens
        (Budget(1000, 8), 0.5, 16, (0, 0)),  # not a whole slot each: no block
        (Budget(3), 0.5, 4, (0, 0)),  # not a whole token each: no block
        (Budget(), 0.5, 1, (0, 0)),  # no budget at all
        (Budget(1000), 0.0, 1, (0, 0)),  # credit off
    ],
)
def test_block_size(whole: Budget, share: float, instances: int, size: tuple[int, int]) -> None:
    assert block_size(whole, share, instances) == size


def test_a_request_fits_in_what_the_block_has_unused() -> None:
    whole, block = Budget(1000), Block()
    assert not block.fits(1, whole, 0.0)  # nothing held
    block.holds((100, 1), False, 0.0)
    assert block.fits(100, whole, 0.0) and not block.fits(101, whole, 0.0)
    block.take(60, 0.0)
    assert block.fits(40, whole, 0.0) and not block.fits(41, whole, 0.0)
    block.take(40, 0.0)  # without a request budget, slots do not limit
    block.give(60)
    assert block.fits(60, whole, 0.0) and (block.used_tokens, block.used_slots) == (40, 1)


def test_request_slots_limit_when_the_replica_has_a_request_budget() -> None:
    whole, block = Budget(0, 10), Block()
    block.holds((0, 2), False, 0.0)
    block.take(500, 0.0)
    block.take(500, 0.0)
    assert not block.fits(1, whole, 0.0)
    block.give(500)
    assert block.fits(10**6, whole, 0.0)  # no token budget: any cost


def test_nothing_fits_while_others_want_budget_and_then_again() -> None:
    whole, block = Budget(1000), Block()
    block.holds((100, 1), True, 0.0)
    assert not block.fits(1, whole, 0.0) and block.wanted(WANTED_S / 2)
    assert not block.wanted(WANTED_S) and block.fits(1, whole, WANTED_S)  # the word is old: ask again


def test_what_a_block_should_hold() -> None:
    block, size = Block(), (100, 1)
    assert block.wish(size, 0.0) == (0, 0)  # never drawn on: nothing
    block.take(30, 0.0)
    assert block.wish(size, 0.1) == (100, 1)  # drawn on: its size
    assert block.wish((20, 1), 0.1) == (30, 1)  # never less than what runs on it
    assert block.wish(size, IDLE_S) == (30, 1)  # idle: only what runs on it
    block.give(30)
    assert block.wish(size, IDLE_S) == (0, 0)
    block.drawn_at = 5.0  # a request wished it could draw on it
    assert block.wish(size, 5.0) == (100, 1)
    block.holds((100, 1), True, 5.0)
    assert block.wish(size, 5.0) == (0, 0)  # others want budget: everything unused goes back
    assert block.wish((0, 0), 5.0 + WANTED_S) == (0, 0)  # credit off (or no budget): nothing


def test_a_block_shrinks_before_it_asks_and_grows_when_told() -> None:
    block = Block()
    block.holds((100, 2), False, 0.0)
    block.shrink((150, 1))
    assert (block.tokens, block.slots) == (100, 1)  # a shrink never grows it: only Redis's answer does
    block.holds((150, 1), False, 0.0)
    assert (block.tokens, block.slots) == (150, 1) and block.held
    block.shrink((0, 0))
    assert not block.held


def test_pick_takes_the_least_loaded_block_that_holds_the_request() -> None:
    wholes = [Budget(1000)] * 3
    blocks = [Block() for _ in wholes]
    for block in blocks:
        block.holds((100, 1), False, 0.0)
    blocks[0].take(50, 0.0)
    assert pick(blocks, wholes, 10, [0, 1, 2], 0, 0.0) == 1
    assert pick(blocks, wholes, 10, [0, 1, 2], 2, 0.0) == 2  # a tie goes round from the turn
    assert pick(blocks, wholes, 10, [0], 0, 0.0) == 0  # only the allowed ones
    assert pick(blocks, wholes, 60, [0], 0, 0.0) is None

"""The turnstile spreads heavy requests over turns of the event loop, in arrival order, and forgets those that left."""

from __future__ import annotations

import asyncio

from proxy.exchange.turnstile import Turnstile


async def _turns_taken(
    turnstile: Turnstile, requests: int, cancel: frozenset[int] = frozenset()
) -> list[tuple[int, int]]:
    """(request, the turn of the loop it entered in), counting turns with a callback that re-arms itself."""
    turn = 0
    entered: list[tuple[int, int]] = []

    def tick() -> None:
        nonlocal turn
        turn += 1
        if turn < 100:
            asyncio.get_running_loop().call_soon(tick)

    asyncio.get_running_loop().call_soon(tick)

    async def one(i: int) -> None:
        await turnstile.enter()
        entered.append((i, turn))

    async with asyncio.timeout(5), asyncio.TaskGroup() as group:  # a waiter never woken fails the test, not hangs it
        tasks = [group.create_task(one(i)) for i in range(requests)]
        await asyncio.sleep(0)  # every task has started and waits, or entered
        for i in cancel:
            tasks[i].cancel()
    return entered


def test_at_most_per_turn_requests_start_in_one_turn_in_arrival_order() -> None:
    entered = asyncio.run(_turns_taken(Turnstile(per_turn=2), 7))
    assert [i for i, _ in entered] == list(range(7))
    per_turn: dict[int, int] = {}
    for _, turn in entered:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) <= 2
    assert len(per_turn) >= 4  # seven requests, two a turn


def test_a_request_cancelled_while_waiting_takes_no_turn() -> None:
    entered = asyncio.run(_turns_taken(Turnstile(per_turn=1), 5, cancel=frozenset({1, 2})))
    assert [i for i, _ in entered] == [0, 3, 4]


def test_with_no_demand_it_schedules_nothing() -> None:
    async def go() -> bool:
        turnstile = Turnstile(per_turn=1)
        await turnstile.enter()
        for _ in range(3):
            await asyncio.sleep(0)
        return turnstile._next_turn is None  # no callback keeps the loop busy once the turns are spent

    assert asyncio.run(go())

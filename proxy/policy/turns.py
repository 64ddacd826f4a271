"""The truncate policy for conversations of whole items (Responses `input` items, Anthropic `messages`): drop the
oldest turns until the prompt fits. A turn runs from one user input to the next, so a tool call always goes with its
results and a reasoning item with its answer; system and developer items and the last user turn always stay.
Nothing inside an item is cut (its structure is the client's API's, not the chat template's)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

Items = list[Any]
CountItems = Callable[[Items], Awaitable[int]]


@dataclass(frozen=True)
class TurnCut:
    items: Items
    prompt_tokens: int
    dropped: int  # items dropped


def droppable_turns(items: Items, starts_turn: Callable[[Any], bool], kept: Callable[[Any], bool]) -> list[list[int]]:
    """The indices of each turn's droppable items, oldest turn first; the last turn is not among them."""
    starts = [i for i, item in enumerate(items) if starts_turn(item)]
    end = starts[-1] if starts else 0
    units: list[list[int]] = []
    for i in range(end):
        if not units or (starts_turn(items[i]) and units[-1]):
            units.append([])
        if not kept(items[i]):
            units[-1].append(i)
    return [unit for unit in units if unit]


async def drop_turns(items: Items, units: list[list[int]], budget: int, count: CountItems) -> TurnCut | None:
    """The fewest oldest turns to drop for the prompt to fit `budget` tokens; None when dropping all of them is not
    enough. The count falls as more turns go, so the fewest is found by bisection, each step counted exactly."""
    low, high = 0, len(units)
    if not units or await count(_without(items, units)) > budget:
        return None
    while low < high:
        middle = (low + high) // 2
        if await count(_without(items, units[:middle])) <= budget:
            high = middle
        else:
            low = middle + 1
    kept = _without(items, units[:low])
    return TurnCut(kept, await count(kept), len(items) - len(kept))


def _without(items: Items, units: list[list[int]]) -> Items:
    gone = {i for unit in units for i in unit}
    return [item for i, item in enumerate(items) if i not in gone]

"""The one way tests wait for something that happens in another thread or process: poll a condition until it holds
or the time is up (bounded, so a test that waits can only fail, never hang)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def eventually(condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.02) -> bool:
    """True as soon as `condition()` holds; False if it still does not after `timeout_s` (checked once more then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return bool(condition())


async def until(condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.01) -> bool:
    """`eventually` for a test on an event loop: True as soon as `condition()` holds, False if it still does not after
    `timeout_s` (checked once more then), yielding to the loop in between."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if condition():
            return True
        await asyncio.sleep(interval_s)
    return bool(condition())

"""A front end's stop (SIGTERM, SIGINT): from `stop()` it takes no new request, the requests in flight get
server.drain_timeout_s to end, and those still running then are cut; one line says what was cut. serve's are cut by
uvicorn (its graceful-shutdown timeout cancels them), the external processor's by `cut()`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("token_guard.drain")


class Drain:
    def __init__(self) -> None:
        self.stopping = False
        self.cutting = False  # the drain's time is up: a request cancelled now was cut, not left by its client
        self.at_stop: int | None = None  # requests in flight when the stop came (None: not told when it came)
        self.cut: dict[str, int] = {}  # how each request cut at the drain's end was ended -> how many
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle: asyncio.Event | None = None  # set once nothing is in flight, while a front end waits for that

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def enter(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)

    def leave(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if self._idle is not None and not self._tasks:
            self._idle.set()

    def stop(self) -> None:
        """No new request from now on (the front end refuses them, and says it is not ready)."""
        if not self.stopping:
            self.stopping, self.at_stop = True, len(self._tasks)

    async def all_ended(self, timeout_s: float | None) -> bool:
        """Whether every request in flight ended within `timeout_s` (None: however long they take)."""
        if not self._tasks:
            return True
        self._idle = asyncio.Event()  # made only now: until a front end waits, a request's end sets no event
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def cut_all(self) -> int:
        """Cancel every request still in flight; how many there were."""
        self.cutting = True
        for task in self._tasks:
            task.cancel("cut at the end of the drain")
        return len(self._tasks)

    def was_cut(self, how: str) -> None:
        self.cut[how] = self.cut.get(how, 0) + 1

    def report(self, front_end: str, grace_s: float | None) -> None:
        """The one line that says what the stop cut."""
        total = sum(self.cut.values())
        head = front_end + " stopped" + ("" if self.at_stop is None else f": {self.at_stop} request(s) in flight at "
                                         "the stop")  # fmt: skip
        if not total:
            log.info("%s; none cut", head)
            return
        how = ", ".join(f"{count} {way}" for way, count in sorted(self.cut.items()))
        log.warning("%s; %d cut at the end of the drain (server.drain_timeout_s %g s): %s", head, total, grace_s or 0,
                    how)  # fmt: skip

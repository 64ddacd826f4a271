"""A deadline for an upstream answer's silence: it fires once the guard has waited `timeout_s` for the next piece.

aiohttp's own read timeout (`sock_read`) cancels and re-arms a timer on every piece it receives, ~2 us each: a
17-event stream paid ~35 us, a tenth of what a bare relay spends on the whole stream. Here one timer serves the whole
answer: each piece only notes the time, and the timer, when it comes due early, re-arms itself for what is left.

Only waiting counts, as with aiohttp (which stops its timer while it has stopped reading): the time the guard spends
with a piece in hand, relaying it to a client that reads slowly, is not the upstream's silence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class SilenceWatch:
    __slots__ = ("_loop", "_timeout_s", "_on_silence", "_since", "_handle")

    def __init__(self, timeout_s: float, on_silence: Callable[[], None]) -> None:
        """Starts waiting now; `on_silence` is called once, from the event loop, if a wait reaches `timeout_s`."""
        self._loop = asyncio.get_running_loop()
        self._timeout_s = timeout_s
        self._on_silence = on_silence
        self._since: float | None = self._loop.time()  # when the current wait began; None while not waiting
        self._handle: asyncio.TimerHandle | None = self._loop.call_at(self._since + timeout_s, self._check)

    def heard(self) -> None:
        """A piece arrived: the wait is over until resume()."""
        self._since = None

    def resume(self) -> None:
        """Waiting for the next piece starts now."""
        self._since = self._loop.time()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        now = self._loop.time()
        due = now + self._timeout_s if self._since is None else self._since + self._timeout_s
        if due > now:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._handle = None
        self._on_silence()

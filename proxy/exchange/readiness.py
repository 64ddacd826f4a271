"""Whether the guard knows how its upstream counts: the models, their windows, the default model, the server's
defaults and the start-up check's verdicts, all learned. Until then no prompt is counted: a guarded request waits for
it up to server.ready_wait_s, then is answered 503 with Retry-After; the readiness probe says not ready meanwhile.
An upstream replica that comes back after being out may have restarted with other flags: it is all learned again, the
same way."""

from __future__ import annotations

import asyncio

from proxy.errors import GuardUnavailable

RETRY_AFTER_S = 2
NOT_READY = "token-guard is learning how its upstream counts (models, windows, server defaults); try again shortly."


class Learning:
    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        self._known = asyncio.Event()
        self._stale = asyncio.Event()  # told: learn it all again (a replica came back)

    @property
    def known(self) -> bool:
        return self._known.is_set()

    def learned(self) -> None:
        self._known.set()

    def stale(self) -> None:
        """What was learned may no longer hold (a replica came back, perhaps restarted): count nothing from now on
        until it is learned again."""
        self._known.clear()
        self._stale.set()

    async def until_stale(self) -> None:
        await self._stale.wait()
        self._stale.clear()

    async def wait(self) -> None:
        """Return once it is known; raise GuardUnavailable (503, Retry-After) when it is not within wait_s."""
        if self._known.is_set():
            return
        try:
            async with asyncio.timeout(self.wait_s):
                await self._known.wait()
        except TimeoutError:
            raise GuardUnavailable(NOT_READY, RETRY_AFTER_S, "not_ready") from None

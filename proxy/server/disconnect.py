"""Work that stops when the client goes away: cancelling it closes its upstream connections, which is what makes
vLLM abort the generation and free its KV cache.

`ClientWatch` works like `asyncio.timeout()`: inside its block, a client disconnect cancels the task running the
block, and the block ends with `ClientGone` instead of the CancelledError. One watcher task per request waits on the
ASGI receive channel; it lives exactly as long as the block (cancelled on the way out), so nothing is orphaned, and
the relay loop pays nothing per chunk for being watched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from proxy.server.asgi import ClientGone, Receive


class ClientWatch:
    def __init__(self, receive: Receive, answered: Callable[[], bool] = lambda: False) -> None:
        self._receive = receive
        self._answered = answered  # the server reports a disconnect after the last byte too: that one is no news
        self._task: asyncio.Task[object] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.gone = False

    async def __aenter__(self) -> ClientWatch:
        self._task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        self._watcher = loop.create_task(self._watch())  # bound to this block: cancelled in __aexit__
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._watcher is not None and self._task is not None
        self._watcher.cancel()
        if self.gone and kind is asyncio.CancelledError and self._task.uncancel() == 0:
            raise ClientGone() from None

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if not self._answered() and self._task is not None:
            self.gone = True
            self._task.cancel()

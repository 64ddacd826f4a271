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

from proxy.server.asgi import ClientGone, Message, Receive


class ClientWatch:
    def __init__(self, receive: Receive, answered: Callable[[], bool] = lambda: False) -> None:
        self._receive = receive
        self._answered = answered  # the server reports a disconnect after the last byte too: that one is no news
        self._task: asyncio.Task[object] | None = None
        self._watcher: asyncio.Future[Message] | None = None
        self.gone = False

    async def __aenter__(self) -> ClientWatch:
        self._task = asyncio.current_task()
        self._listen()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        if self.gone and kind is asyncio.CancelledError and self._task is not None and self._task.uncancel() == 0:
            raise ClientGone() from None

    def _listen(self) -> None:
        # The server's own receive() coroutine runs as the task: no wrapper coroutine, and a callback (not a second
        # awaiting task) decides what its message means.
        self._watcher = asyncio.ensure_future(self._receive())  # bound to this block: cancelled in __aexit__
        self._watcher.add_done_callback(self._heard)

    def _heard(self, watcher: asyncio.Future[Message]) -> None:
        if watcher is not self._watcher or watcher.cancelled():
            return
        if watcher.result()["type"] != "http.disconnect":
            self._listen()  # the rest of a body nobody read: keep listening
        elif not self._answered() and self._task is not None:
            self.gone = True
            self._task.cancel()

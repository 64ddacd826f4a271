"""Work that stops when the client goes away: cancelling it closes its upstream connections, which is what makes
vLLM abort the generation and free its KV cache.

`ClientWatch` works like `asyncio.timeout()`: inside its block, a client disconnect cancels the task running the
block, and the block ends with `ClientGone` instead of the CancelledError. Under the guard's own protocol
(protocol.py) the server calls the watch back the moment the connection closes, in that very callback; under any
other server one watcher task per request waits on the ASGI receive channel, which hears of it a loop turn or two
later. Either way the watch lives exactly as long as the block, and the relay loop pays nothing per piece for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from proxy.server.asgi import ClientGone, Message, Receive


class ClientWatch:
    def __init__(
        self, receive: Receive, answered: Callable[[], bool] = lambda: False,
        on_gone: list[Callable[[], None]] | None = None,
    ) -> None:  # fmt: skip
        self._receive = receive
        self._answered = answered  # the server reports a disconnect after the last byte too: that one is no news
        self._on_gone = on_gone  # the server's callbacks for this request's connection closing, when it has them
        self._task: asyncio.Task[object] | None = None
        self._watcher: asyncio.Future[Message] | None = None
        self.gone = False

    async def __aenter__(self) -> ClientWatch:
        self._task = asyncio.current_task()
        if self._on_gone is not None:
            self._on_gone.append(self._left)
        else:
            self._listen()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._on_gone is not None and self._left in self._on_gone:
            self._on_gone.remove(self._left)
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
        else:
            self._left()

    def _left(self) -> None:
        if not self.gone and not self._answered() and self._task is not None and not self._task.done():
            self.gone = True
            self._task.cancel()

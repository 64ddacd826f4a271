"""A streamed response that stops the moment the client disconnects, and then closes its body (and so the upstream
connections behind it) for sure.

Starlette's StreamingResponse cancels its body through an anyio cancel scope, which re-cancels every await of the
body's cleanup; closing the upstream then proved unreliable (vLLM kept generating for nobody). This one runs the
sender and a disconnect watcher as plain asyncio tasks and closes the body outside any cancel scope.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class StreamResponse(Response):
    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.stream = body
        self.on_close: Callable[[bool], None] | None = None  # told whether the client went away first
        self.on_release: Callable[[], None] | None = None  # frees what the stream held (admission budget)
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.ensure_future(self._send_all(send))
        watching = asyncio.ensure_future(_client_gone(receive))
        gone = True  # unless the whole answer went out (the server reports a disconnect after that, too)
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
            gone = not (sending.done() and not sending.cancelled() and sending.exception() is None)
        finally:
            for task in (sending, watching):
                task.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
            await self.stream.aclose()
            if self.on_release is not None:
                self.on_release()
            if self.on_close is not None:
                self.on_close(gone)
        if sending.done() and not sending.cancelled() and sending.exception() is not None:
            raise sending.exception()  # type: ignore[misc]

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for chunk in self.stream:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _client_gone(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass

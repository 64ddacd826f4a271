"""A streamed response that stops the moment the client disconnects, and then closes its body (and so the upstream
connections behind it) for sure.

Starlette's StreamingResponse cancels its body through an anyio cancel scope, which re-cancels every await of the
body's cleanup; closing the upstream then proved unreliable (vLLM kept generating for nobody). This one runs the
sender and a disconnect watcher as two tasks of a TaskGroup and closes the body after the group, outside any cancel
scope.

A body may decide the status itself: with `on_early_error`, its first item is awaited before anything is sent, and
if the body fails instead, the response that function makes for the failure is sent in its place (a chunked
request whose first part was refused gets that part's error, not a 200 stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import first_error
from proxy.server.disconnect import wait_for_disconnect


class StreamResponse(Response):
    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        on_early_error: Callable[[Exception], Response] | None = None,
    ) -> None:
        self.stream = body
        self.on_close: Callable[[bool], None] | None = None  # told whether the client went away first
        self.on_release: Callable[[], None] | None = None  # frees what the stream held (admission budget)
        self.on_early_error = on_early_error
        self._started = False
        self.status_code = status_code
        self.media_type = media_type
        self.background = None
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending: asyncio.Task[None] | None = None
        failure: BaseException | None = None
        try:
            async with asyncio.TaskGroup() as group:
                sending = group.create_task(self._send_all(scope, receive, send))
                watching = group.create_task(wait_for_disconnect(receive))
                await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
                sending.cancel()
                watching.cancel()
        except BaseExceptionGroup as errors:
            failure = first_error(errors)
        finally:
            # The whole answer went out unless the sender finished cleanly (the server reports a disconnect after
            # the last byte too, so the watcher finishing as well says nothing).
            sent = sending is not None and sending.done() and not sending.cancelled() and not sending.exception()
            if not sent and not self._started:
                self.status_code = 499  # the client left before the answer began (nginx's code for it)
            await self.stream.aclose()
            if self.on_release is not None:
                self.on_release()
            if self.on_close is not None:
                self.on_close(not sent)
        if failure is not None:
            raise failure

    async def _send_all(self, scope: Scope, receive: Receive, send: Send) -> None:
        first = b""
        if self.on_early_error is not None:
            try:
                first = await anext(self.stream, b"")
            except Exception as exc:
                early = self.on_early_error(exc)
                self.status_code = early.status_code
                await early(scope, receive, send)
                return
        await self._start(send)
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in self.stream:
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _start(self, send: Send) -> None:
        self._started = True
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})

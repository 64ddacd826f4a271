"""Send a body the guard makes itself (a chunked request's merged stream) as server-sent events. The body may decide
the status before its first byte: its first item is awaited before anything is sent, and if the body fails instead,
`on_early_error` answers in its place (a chunked request whose first chunk was refused gets that chunk's error, not a
200 stream)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable

from proxy.exchange.headers import Headers
from proxy.server.asgi import Reply

SSE = b"text/event-stream; charset=utf-8"


async def send_stream(
    reply: Reply,
    headers: Headers,
    body: AsyncGenerator[bytes, None],
    on_early_error: Callable[[Exception], Awaitable[None]] | None = None,
) -> None:
    try:
        first = b""
        if on_early_error is not None:
            try:
                first = await anext(body, b"")
            except Exception as exc:
                await on_early_error(exc)
                return
        await reply.start(200, [*headers, (b"content-type", SSE)])
        if first:
            await reply.write(first)
        async for piece in body:
            if piece:
                await reply.write(piece)
        await reply.end()
    finally:
        await body.aclose()

"""Run the chunks of a chunked request against the upstream, at most `max_fanout` at a time, in order of start, all
in one TaskGroup: a failure, or the client going away, cancels every chunk, which closes its upstream connection and
makes vLLM abort it.

Non-streaming: every chunk's JSON answer, or the first failure. Streaming: chunk 0's events as they arrive, then chunk
1's (already running, or buffered), and so on; a failure after the first byte becomes an SSE error event then
[DONE], a failure before it is raised (the client then gets that error's status).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy import error_bodies
from proxy.errors import GuardError, UpstreamFailed, UpstreamTooLarge, UpstreamUnavailable, first_error
from proxy.policy.merge import StreamMerger
from proxy.upstream.client import Opened, Upstream
from proxy.upstream.sanitize import withheld
from proxy.upstream.transport import ANSWER_BYTES, ERROR_BYTES, EVENT_BYTES, Answer


@dataclass
class ChunkFailed(Exception):
    """A chunk the upstream answered with an error: relayed to the client as the upstream said it."""

    status: int
    body: bytes
    content_type: str
    cut: bool = False  # the body is only the first ERROR_BYTES of the upstream's

    def relayed(self) -> dict[str, Any] | None:
        """The upstream's own error envelope, to relay as it said it; None when its body is not one, or would show
        the upstream's internals."""
        if withheld(self.status, self.content_type, self.body, self.cut) is not None:
            return None
        try:
            body = json.loads(self.body)
        except ValueError:
            return None
        return body if isinstance(body, dict) and isinstance(body.get("error"), dict) else None

    def error(self) -> UpstreamFailed:
        """The guard's own error for a failure whose body it does not relay: the upstream's text, unless that would
        show its internals."""
        text = self.body.decode(errors="replace")
        return withheld(self.status, self.content_type, self.body, self.cut) or UpstreamFailed(text, self.status)


async def failure(response: Answer) -> ChunkFailed:
    body, cut = await response.head(ERROR_BYTES)
    return ChunkFailed(response.status, body, response.content_type or "application/json", cut)


class InFlight(Protocol):
    """Where the chunks running now are counted (the server's gauge)."""

    def inc(self) -> None: ...
    def dec(self) -> None: ...


class ChunkRunner:
    def __init__(
        self,
        upstream: Upstream,
        path: str,
        headers: Mapping[str, str],
        max_fanout: int,
        in_flight: InFlight | None = None,
        handed: Callable[[bool], None] | None = None,
    ) -> None:
        """`handed`: told of each chunk that leaves for a replica, and of each that could not reach one after all
        (Upstream.open)."""
        self.upstream, self.path, self.headers = upstream, path, headers
        self.gate = asyncio.Semaphore(max_fanout)
        self.in_flight = in_flight
        self.handed = handed

    async def answers(self, bodies: list[dict[str, Any]], costs: list[int]) -> list[dict[str, Any]]:
        """Every chunk's answer, in order; raises the first failure (ChunkFailed or GuardError)."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._answer(b, c)) for b, c in zip(bodies, costs, strict=True)]
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None
        return [task.result() for task in tasks]

    async def _answer(self, body: dict[str, Any], cost: int) -> dict[str, Any]:
        async with self.gate:
            opened = await self._open(body, cost)
            response = opened.response
            try:
                if response.status != 200:
                    raise await failure(response)
                raw = await response.read(ANSWER_BYTES)
            except GuardError as exc:
                raise UpstreamUnavailable(f"a chunk's answer broke off: {exc.message}") from None
            finally:
                self._done(opened)
                response.close()
        try:
            answer: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            raise UpstreamUnavailable("a chunk's answer was not valid JSON") from exc
        return answer

    async def stream(
        self, bodies: list[dict[str, Any]], costs: list[int], merger: StreamMerger
    ) -> AsyncGenerator[bytes, None]:
        """The merged stream. Its first item is b"" once chunk 0 has opened (the answer may start); chunk 0's failure
        to open is raised instead, before anything was sent."""
        queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in bodies]
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.TaskGroup() as group:
                chunks = [
                    group.create_task(self._produce(i, body, cost, queues, opened))
                    for i, (body, cost) in enumerate(zip(bodies, costs, strict=True))
                ]
                try:
                    await opened
                    yield b""
                    async for out in _merged(queues, merger):
                        yield out
                finally:  # the stream ended, failed or was abandoned: every chunk stops with it
                    for chunk in chunks:
                        chunk.cancel()
        except BaseExceptionGroup as errors:
            raise first_error(errors) from None

    async def _produce(self, index: int, body: dict[str, Any], cost: int, queues: list[asyncio.Queue[Any]],
                       opened: asyncio.Future[None]) -> None:  # fmt: skip
        try:
            async with self.gate:
                chunk = await self._open(body, cost)
                response = chunk.response
                try:
                    if response.status != 200:
                        raise await failure(response)
                    if index == 0:
                        opened.set_result(None)
                    async for event in sse_events(response):
                        await queues[index].put(event)
                finally:
                    self._done(chunk)
                    response.close()
            await queues[index].put(None)
        except Exception as exc:  # any failure must reach the reader, or it would wait forever
            if index == 0 and not opened.done():
                opened.set_exception(exc)
            for queue in queues:  # the reader learns of the failure at once, whichever chunk it is reading
                queue.put_nowait(exc)

    async def _open(self, body: dict[str, Any], cost: int) -> Opened:
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        if self.in_flight is not None:
            self.in_flight.inc()
        try:
            return await self.upstream.open("POST", self.path, self.headers, raw, cost=cost, handed=self.handed)
        except BaseException:
            if self.in_flight is not None:
                self.in_flight.dec()
            raise

    def _done(self, opened: Opened) -> None:
        if self.in_flight is not None:
            self.in_flight.dec()
        self.upstream.release(opened.ticket)


async def _merged(queues: list[asyncio.Queue[Any]], merger: StreamMerger) -> AsyncIterator[bytes]:
    for index, queue in enumerate(queues):
        while (event := await queue.get()) is not None:
            if isinstance(event, BaseException):
                yield _error_event(event)
                return
            if "error" in event:  # the upstream's own in-stream error: relay it and stop
                yield error_bodies.relayed_event(event)
                return
            for out in merger.feed(index, event):
                yield out
    for out in merger.finish():
        yield out


def _error_event(exc: BaseException) -> bytes:
    """The event that ends a chunked stream (chat or completions: OpenAI's envelope) when a chunk failed."""
    if isinstance(exc, ChunkFailed):
        relayed = exc.relayed()
        if relayed is not None:
            return error_bodies.relayed_event(relayed)
        exc = exc.error()
    if not isinstance(exc, GuardError):
        exc = UpstreamUnavailable(f"a chunk of the chunked request failed: {type(exc).__name__}")
    return error_bodies.stream_event(exc)


async def sse_events(response: Answer) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream's `data:` events, up to [DONE]."""
    buffer = b""
    async for piece in response.pieces():
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield json.loads(payload)
        if len(buffer) > EVENT_BYTES:  # an event that does not end: kept whole, it would take any memory
            raise UpstreamTooLarge(f"An event in the upstream's stream is larger than {EVENT_BYTES} bytes.")

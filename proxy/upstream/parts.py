"""Run the parts of a chunked request against the upstream, at most `max_fanout` at a time, in order of start.

Non-streaming: every part's JSON answer, or the first failure (the others are cancelled). Streaming: part 0's
chunks as they arrive, then part 1's (already running or buffered), and so on; a failure becomes an SSE error event
then [DONE]. Cancelling (client gone, failure) closes every part's upstream connection, which makes vLLM abort it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import Gauge

from proxy.errors import GuardError, UpstreamUnavailable
from proxy.policy.merge import StreamMerger, sse
from proxy.server.relay import close_quietly
from proxy.upstream.client import Opened, Upstream


@dataclass
class PartFailed(Exception):
    """A part the upstream answered with an error: relayed to the client as the upstream said it."""

    status: int
    body: bytes
    content_type: str


class Fanout:
    def __init__(
        self, upstream: Upstream, path: str, headers: Mapping[str, str], max_fanout: int, in_flight: Gauge | None = None
    ) -> None:
        self.upstream, self.path, self.headers = upstream, path, headers
        self.gate = asyncio.Semaphore(max_fanout)
        self.in_flight = in_flight

    async def answers(self, bodies: list[dict[str, Any]], costs: list[int]) -> list[dict[str, Any]]:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._answer(b, c)) for b, c in zip(bodies, costs, strict=True)]
        return [task.result() for task in tasks]

    async def _answer(self, body: dict[str, Any], cost: int) -> dict[str, Any]:
        async with self.gate:
            opened = await self._open(body, cost)
            response = opened.response
            try:
                raw = await response.aread()
            except httpx.HTTPError as exc:
                raise UpstreamUnavailable(f"a part's answer broke off: {type(exc).__name__}") from exc
            finally:
                self._part_done()
                self.upstream.release(opened.ticket)
                await close_quietly(response)
        if response.status_code != 200:
            raise PartFailed(response.status_code, raw, response.headers.get("content-type", "application/json"))
        try:
            answer: dict[str, Any] = json.loads(raw)
        except ValueError as exc:
            raise UpstreamUnavailable("a part's answer was not valid JSON") from exc
        return answer

    async def _open(self, body: dict[str, Any], cost: int) -> Opened:
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        if self.in_flight is not None:
            self.in_flight.inc()
        try:
            return await self.upstream.open("POST", self.path, "", self.headers, raw, cost=cost)
        except BaseException:
            self._part_done()
            raise

    def _part_done(self) -> None:
        if self.in_flight is not None:
            self.in_flight.dec()

    async def stream(
        self, bodies: list[dict[str, Any]], costs: list[int], merger: StreamMerger
    ) -> AsyncGenerator[bytes, None]:
        """Start every part now; the first part's failure to start is raised here, before any byte is sent."""
        queues: list[asyncio.Queue[Any]] = [asyncio.Queue() for _ in bodies]
        first_open: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        tasks = [
            asyncio.ensure_future(self._produce(i, b, c, queues, first_open))
            for i, (b, c) in enumerate(zip(bodies, costs, strict=True))
        ]
        try:
            await asyncio.shield(first_open)
        except BaseException:
            await _cancel(tasks)
            raise
        return self._consume(queues, tasks, merger)

    async def _produce(self, index: int, body: dict[str, Any], cost: int, queues: list[asyncio.Queue[Any]],
                       first_open: asyncio.Future[None]) -> None:  # fmt: skip
        try:
            async with self.gate:
                opened = await self._open(body, cost)
                response = opened.response
                try:
                    if response.status_code != 200:
                        raw = await response.aread()
                        raise PartFailed(response.status_code, raw, response.headers.get("content-type", ""))
                    if index == 0:
                        first_open.set_result(None)
                    async for event in sse_events(response):
                        await queues[index].put(event)
                finally:
                    self._part_done()
                    self.upstream.release(opened.ticket)
                    await close_quietly(response)
            await queues[index].put(None)
        except Exception as exc:  # any failure must reach the reader, or it would wait forever
            if index == 0 and not first_open.done():
                first_open.set_exception(exc)
            for queue in queues:  # the reader learns of the failure at once, whichever part it is reading
                queue.put_nowait(exc)

    async def _consume(self, queues: list[asyncio.Queue[Any]], tasks: Sequence[asyncio.Future[None]],
                       merger: StreamMerger) -> AsyncGenerator[bytes, None]:  # fmt: skip
        try:
            for index, queue in enumerate(queues):
                while (event := await queue.get()) is not None:
                    if isinstance(event, BaseException):
                        yield _error_event(event)
                        return
                    if "error" in event:  # the upstream's own in-stream error: relay it and stop
                        yield sse(event) + b"data: [DONE]\n\n"
                        return
                    for out in merger.feed(index, event):
                        yield out
            for out in merger.finish():
                yield out
        finally:
            await _cancel(tasks)


def _error_event(exc: BaseException) -> bytes:
    if isinstance(exc, GuardError):
        return exc.sse_bytes()
    if isinstance(exc, PartFailed):
        try:
            body = json.loads(exc.body)
        except ValueError:
            body = {"error": {"message": exc.body.decode(errors="replace"), "type": "UpstreamError", "param": None,
                              "code": exc.status}}  # fmt: skip
        return sse(body) + b"data: [DONE]\n\n"
    return UpstreamUnavailable(f"a part of the chunked request failed: {type(exc).__name__}").sse_bytes()


async def _cancel(tasks: Sequence[asyncio.Future[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of an SSE stream's `data:` events, up to [DONE]."""
    buffer = b""
    async for chunk in response.aiter_raw():
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                yield json.loads(payload)

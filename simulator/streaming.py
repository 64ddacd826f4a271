"""Run a generation to the client: SSE event streams, and a non-stream run that stops when the client leaves.

Disconnects are detected like vLLM does: a non-stream request races the work against `http.disconnect` on
the ASGI receive channel (vLLM's `with_cancellation`); a stream stops when Starlette cancels it on disconnect.
Either way the request's tracker records "aborted" exactly once and nothing more is generated.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from simulator.api_shapes import api_events, whole_body
from simulator.generation import (
    Engine,
    Generation,
    Piece,
    Token,
    duration,
    generated_by,
    output_of,
    sequences,
    steps,
)
from simulator.responses import DONE, Output, Wire
from simulator.stats import RequestTracker
from simulator.token_out import generate_body as token_body
from simulator.token_out import generate_events

T = TypeVar("T")


def outputs(generation: Generation, pieces: list[Piece]) -> list[Output]:
    result = []
    for seq in sequences(generation):
        ids, text = output_of(pieces, seq)
        result.append(Output(sequence=seq, token_ids=ids, text=text))
    return result


async def run_unless_disconnected(receive: Receive, work: Callable[[], Awaitable[T]]) -> T | None:
    """The work's result, or None when the client disconnected first (the work is then cancelled)."""
    result: list[T] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            result.append(await work())
            group.cancel_scope.cancel()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(run)
        group.start_soon(watch)
    return result[0] if result else None


async def generate_body(generation: Generation, wire: Wire, engine: Engine, tracker: RequestTracker) -> dict[str, Any]:
    if engine.kv is None:
        delay = duration(sequences(generation), engine)
        if delay > 0:
            started = time.monotonic()
            try:
                await anyio.sleep(delay)
            except anyio.get_cancelled_exc_class():  # aborted: what it generated until then was generated all the same
                tracker.generated(generated_by(sequences(generation), engine, time.monotonic() - started))
                raise
    else:  # step by step, so that the pace follows the KV load as other requests come and go
        made = 0
        try:
            async for step in steps(sequences(generation), engine):
                made += len(step)
        except anyio.get_cancelled_exc_class():
            tracker.generated(made)
            raise
    done = outputs(generation, engine.pieces)
    tracker.generated(sum(len(o.token_ids) for o in done))
    if generation.endpoint in ("responses", "messages"):
        return whole_body(generation, done[0].text, len(done[0].token_ids))
    if generation.endpoint == "generate":
        return token_body(generation, done, wire.omits_null_details)
    return wire.chat_body(done) if generation.endpoint == "chat" else wire.completion_body(done)


async def events(
    generation: Generation, wire: Wire, engine: Engine, tracker: RequestTracker, own_types: bool = False
) -> AsyncGenerator[str, None]:
    """The stream's events; `own_types`: the Messages API names its errors in Anthropic's types (0.33+)."""
    if generation.engine_error is not None and generation.endpoint == "messages":
        yield generation.engine_error.anthropic_event(own_types)  # before message_start, and nothing after it
        return
    if generation.engine_error is not None:
        yield generation.engine_error.sse_event()
        yield DONE
        return
    if generation.endpoint in ("responses", "messages"):  # their own event streams, without [DONE]
        async for event in api_events(generation, engine, tracker):
            yield event
        return
    if generation.endpoint == "generate":
        async for event in generate_events(generation, engine, tracker, wire.omits_null_details):
            yield event
        return
    seqs = sequences(generation)
    generated = [0] * len(seqs)
    first = True
    async for step in steps(seqs, engine):
        tracker.generated(len(step))
        if first and generation.endpoint == "chat":
            for event in _chat_opening(generation, wire):
                yield event
        first = False
        for token in step:
            generated[token.sequence.index] += 1
            yield _token_event(generation, wire, token, generated[token.sequence.index])
    if generation.include_usage:
        prompt_tokens = sum(len(p.token_ids) for p in generation.prompts)
        yield wire.usage_event(prompt_tokens, sum(generated))
    yield DONE


def _chat_opening(generation: Generation, wire: Wire) -> list[str]:
    events = [wire.chat_role_event(i) for i in range(generation.n)]
    if generation.chat_echo:
        events += [wire.chat_echo_event(i) for i in range(generation.n)]
    return events


def _token_event(generation: Generation, wire: Wire, token: Token, generated: int) -> str:
    if generation.endpoint == "chat":
        return wire.chat_token_event(token, generated)
    return wire.completion_token_event(token, generated)


class TrackedStream(StreamingResponse):
    """A text/event-stream response that records how it ended: completed once [DONE] went out, aborted when
    the client left first (Starlette cancels the stream on disconnect; a failed send ends it too)."""

    def __init__(self, body: AsyncGenerator[str, None], tracker: RequestTracker, *, failed: bool = False) -> None:
        self._events = body
        self._tracker = tracker
        self._failed = failed
        self._finished = False
        self._watched = self._watch()
        super().__init__(self._watched, media_type="text/event-stream")

    async def _watch(self) -> AsyncGenerator[str, None]:
        async for event in self._events:
            yield event
        self._finished = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Stop generating now rather than whenever the suspended generators get collected.
            with anyio.CancelScope(shield=True):
                await self._watched.aclose()
                await self._events.aclose()
            if not self._finished:
                self._tracker.finish("aborted")
            else:
                self._tracker.finish("rejected" if self._failed else "completed")

"""Carry out a chunked request: run its chunks (upstream/chunks.py) and merge their answers (policy/merge.py) into one,
streamed or not, with the map-reduce step when the policy asks for it. A failing chunk's own error is what the client
gets; a client that goes away cancels every chunk."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from proxy.errors import GuardError, internal_error
from proxy.exchange.headers import Headers
from proxy.exchange.record import RequestRecord
from proxy.policy.guard import Guard
from proxy.policy.merge import StreamMerger, merge_answers, sum_usage, told_usage
from proxy.policy.outcome import Chunked
from proxy.policy.usage import Charge
from proxy.server.asgi import Reply
from proxy.server.error_reply import send_error
from proxy.server.streaming import send_stream
from proxy.upstream.chunks import ChunkFailed, ChunkRunner
from proxy.upstream.sanitize import sanitize_upstream_error

log = logging.getLogger("token_guard.chunked")


async def answer_chunked(
    reply: Reply, chunked: Chunked, runner: ChunkRunner, guard: Guard, headers: Headers, record: RequestRecord
) -> None:
    """Answer it. A keyed request's charge learns what its merged answer used (its chunks' usage summed) as soon as
    that is known: the client may leave right after the last byte, which cancels this before it could return. The
    record says how the answers were merged, when the policy asked for the combining request."""
    charge = record.charge
    if chunked.stream and chunked.policy.chunk_merge == "concat":  # chunk 1's tokens go out as they are generated
        merger = StreamMerger(chunked.kind, len(chunked.bodies), chunked.policy.chunk_separator, chunked.include_usage)
        try:
            await _stream(reply, runner.stream(chunked.bodies, chunked.costs, merger), headers)
        finally:  # None unless the stream finished: a client that left part way pays the chunks' reservation
            _pay(charge, merger.usage())
        return
    try:
        await _merged(reply, runner, chunked, guard, headers, record)
    except (ChunkFailed, GuardError) as exc:
        await failed(reply, exc, headers)


async def failed(reply: Reply, exc: Exception, headers: Headers) -> None:
    """The answer for a chunked request that failed before its answer started."""
    if isinstance(exc, ChunkFailed):  # the upstream's own error for that chunk, as it said it (but no internals)
        sanitized = sanitize_upstream_error(exc.status, exc.content_type, exc.body, exc.cut)
        content_type = b"application/json" if sanitized is not None else exc.content_type.encode("latin-1")
        await reply.whole(exc.status, headers, sanitized or exc.body, content_type)
    elif isinstance(exc, GuardError):
        await send_error(reply, exc, headers)
    else:
        log.error("a chunked request failed unexpectedly", exc_info=exc)
        await send_error(reply, internal_error(), headers)


async def _stream(reply: Reply, body: AsyncGenerator[bytes, None], headers: Headers) -> None:
    async def early(exc: Exception) -> None:
        await failed(reply, exc, headers)

    await send_stream(reply, headers, body, early)


async def _merged(
    reply: Reply, runner: ChunkRunner, chunked: Chunked, guard: Guard, headers: Headers, record: RequestRecord
) -> None:
    charge = record.charge
    bodies = [_non_streaming(b) for b in chunked.bodies] if chunked.stream else chunked.bodies
    answers = await runner.answers(bodies, chunked.costs)
    merged = merge_answers(chunked.kind, answers, chunked.policy.chunk_separator)
    usages = [a.get("usage") for a in answers]
    if chunked.policy.chunk_merge == "reduce":
        reduce = await guard.reduce(chunked, answers)
        record.merge = "concat" if reduce is None else "reduce"
        if reduce is None:
            headers = [*headers, (b"x-token-guard-merge", b"concat (the combining request would not fit)")]
        else:
            headers = [*headers, (b"x-token-guard-merge", b"reduce")]
            reduce_body, reduce_cost = reduce
            # Reserved as it goes out, like any request: if the client leaves, vLLM aborts it part way, unreported.
            _pay(charge, told_usage(usages), reduce_cost)
            if chunked.stream:
                merger = StreamMerger(chunked.kind, 1, "", chunked.include_usage, usages)
                streamed = {**reduce_body, "stream": True, "stream_options": {"include_usage": True}}
                try:
                    await _stream(reply, runner.stream([streamed], [reduce_cost], merger), headers)
                finally:  # known once the stream finished, even if the client left right after its last byte
                    _pay(charge, merger.usage())
                return
            (final,) = await runner.answers([reduce_body], [reduce_cost])
            merged = merge_answers(chunked.kind, [final], "")
            usages.append(final.get("usage"))
            merged["usage"] = sum_usage(usages)
    _pay(charge, told_usage(usages))  # every answer is in: what they used is spent, whether the client stays or not
    if chunked.stream:  # the client asked for a stream: one merged answer as a stream of events
        merger = StreamMerger(chunked.kind, 1, "", chunked.include_usage)
        await send_stream(reply, headers, _replay(merger, merged))
        return
    await reply.whole(200, headers, json.dumps(merged, ensure_ascii=False, separators=(",", ":")).encode())


def _pay(charge: Charge | None, usage: dict[str, int] | None, reserved: int = 0) -> None:
    """Settle a keyed request by its answers' summed usage (the chunks' reservation when one did not tell it), plus
    what is `reserved` for a request still running (the combining one). No usage and nothing reserved: unchanged."""
    if charge is None or (usage is None and not reserved):
        return
    spent = charge.tokens if usage is None else usage["prompt_tokens"] + usage["completion_tokens"]
    charge.merged = spent + reserved


def _non_streaming(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}


async def _replay(merger: StreamMerger, answer: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    """A finished answer as SSE events: the role event, the text, the finish event, usage, [DONE]."""
    for event in merger.events_of(answer):
        yield event

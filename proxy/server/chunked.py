"""Carry out a chunked request: run its parts (upstream/parts.py) and merge their answers (policy/merge.py) into one,
streamed or not, with the map-reduce step when the policy asks for it. A failing part's own error is what the client
gets; a client that goes away cancels every part."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import GuardError
from proxy.policy.guard import Guard
from proxy.policy.merge import StreamMerger, merge_answers, sum_usage
from proxy.policy.outcome import Chunked
from proxy.server.disconnect import ClientGone, unless_disconnected
from proxy.server.responses import error_response
from proxy.server.streaming import StreamResponse
from proxy.upstream.parts import PartFailed, PartRunner

log = logging.getLogger("token_guard.chunked")

SSE = "text/event-stream; charset=utf-8"


async def answer_chunked(request: Request, chunked: Chunked, runner: PartRunner, guard: Guard) -> Response:
    headers = chunked.decision.headers()
    if chunked.stream and chunked.policy.chunk_merge == "concat":  # part 1's tokens go out as they are generated
        merger = StreamMerger(chunked.kind, len(chunked.bodies), chunked.policy.chunk_separator, chunked.include_usage)
        return _streamed(runner.stream(chunked.bodies, chunked.costs, merger), headers)
    try:
        return await unless_disconnected(request.receive, _merged(runner, chunked, guard, headers))
    except ClientGone:
        log.info("client went away during a chunked request; %d parts cancelled", len(chunked.bodies))
        return Response(status_code=499)
    except Exception as exc:
        return failed(exc, headers)


def failed(exc: Exception, headers: dict[str, str]) -> Response:
    """The response for a chunked request that failed before its answer started."""
    if isinstance(exc, PartFailed):  # the upstream's own error for that part, as it said it
        return Response(exc.body, exc.status, headers=headers, media_type=exc.content_type)
    if isinstance(exc, GuardError):
        return error_response(exc, headers)
    log.error("a chunked request failed unexpectedly", exc_info=exc)
    return error_response(GuardError("token-guard hit an internal error while running a chunked request."), headers)


async def _merged(runner: PartRunner, chunked: Chunked, guard: Guard, headers: dict[str, str]) -> Response:
    bodies = [_non_streaming(b) for b in chunked.bodies] if chunked.stream else chunked.bodies
    answers = await runner.answers(bodies, chunked.costs)
    merged = merge_answers(chunked.kind, answers, chunked.policy.chunk_separator)
    if chunked.policy.chunk_merge == "reduce":
        reduce = await guard.reduce(chunked, answers)
        if reduce is None:
            headers = {**headers, "x-token-guard-merge": "concat (the combining request would not fit)"}
        else:
            headers = {**headers, "x-token-guard-merge": "reduce"}
            reduce_body, reduce_cost = reduce
            if chunked.stream:
                prior = [a.get("usage") for a in answers]
                merger = StreamMerger(chunked.kind, 1, "", chunked.include_usage, prior)
                streamed = {**reduce_body, "stream": True, "stream_options": {"include_usage": True}}
                body = runner.stream([streamed], [reduce_cost], merger)
                return StreamResponse(
                    body, headers=headers, media_type=SSE, on_early_error=lambda e: failed(e, headers)
                )
            (final,) = await runner.answers([reduce_body], [reduce_cost])
            merged = merge_answers(chunked.kind, [final], "")
            merged["usage"] = sum_usage([a.get("usage") for a in [*answers, final]])
    if chunked.stream:  # the client asked for a stream: one merged answer as a stream of chunks
        merger = StreamMerger(chunked.kind, 1, "", chunked.include_usage)
        return StreamResponse(_replay(merger, merged), headers=headers, media_type=SSE)
    return JSONResponse(merged, headers=headers)


def _streamed(body: AsyncGenerator[bytes, None], headers: dict[str, str]) -> StreamResponse:
    """A merged stream; a failure before its first byte is answered as `failed` says."""
    return StreamResponse(body, headers=headers, media_type=SSE, on_early_error=lambda exc: failed(exc, headers))


def _non_streaming(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}


async def _replay(merger: StreamMerger, answer: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    """A finished answer as chunks: the role chunk, the text, the finish chunk, usage, [DONE]."""
    for chunk in merger.chunks_of(answer):
        yield chunk

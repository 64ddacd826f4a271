"""The simulator's HTTP surface: thin routes that parse, call a handler and pick the response by result type
(an ApiError becomes vLLM's error JSON, a non-stream plan a JSON body, a stream plan an SSE response)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from simulator.audio import Task, hear, plan_audio
from simulator.audio import answer as spoken_answer
from simulator.audio import events as spoken_events
from simulator.batch import plan_batch
from simulator.cache_info import cache_config_info
from simulator.chat import plan_chat
from simulator.cohere import cohere_embed
from simulator.completions import plan_completion
from simulator.context import Context
from simulator.converted import plan_invocation, plan_responses
from simulator.decisions import decide
from simulator.errors import ApiError
from simulator.generation import Engine, Generation
from simulator.messages import count_tokens, merges_inline_system, plan_messages
from simulator.orjson_text import orjson_dumps
from simulator.pooling import pool, pooling_invocation
from simulator.pooling_request import ROUTES as POOLING_KINDS
from simulator.pooling_request import Kind
from simulator.render import DISABLED, PATHS, RenderRoute, render
from simulator.responses import Wire
from simulator.settings import SimulatorSettings
from simulator.stats import RequestTracker, SimulatorStats
from simulator.stored import ResponseStore
from simulator.streaming import TrackedStream, events, generate_body, run_unless_disconnected
from simulator.token_in import plan_generate
from simulator.tokenize import detokenize, tokenize
from simulator.wire import parse_json_body

log = logging.getLogger(__name__)

T = TypeVar("T")
# vLLM 0.31/0.32's QueueOverflowError, a GracefulHTTPError: its status, and the status's phrase as the type
QUEUE_FULL = ApiError(
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.",
    status=503, type="Service Unavailable",
)  # fmt: skip
# 0.33's engine_paused RequestError (v1/engine/core.py _reject_add_while_paused), retryable: a RetryableRequestError
PAUSED = ApiError("Generation is paused. Please retry after it resumes.", status=503, type="ServiceUnavailableError")
PAUSE_MODES = ("abort", "wait", "keep")  # vLLM's PauseMode
Planner = Callable[[Context, Any, Mapping[str, str]], Generation]
Worker = Callable[[Context, Any, dict[str, str]], dict[str, Any]]  # a route answered whole, without the engine


def error_response(error: ApiError, anthropic: bool = False, own_types: bool = False) -> JSONResponse:
    """vLLM's error body; on the Anthropic routes its router translates it into Anthropic's envelope (`own_types`:
    with Anthropic's type names, as 0.33+ does)."""
    body = error.anthropic_body(own_types) if anthropic else error.body()
    return JSONResponse(body, status_code=error.status)


def internal_error(exc: Exception) -> JSONResponse:
    log.exception("simulator bug while handling a request")
    return error_response(ApiError(str(exc) or type(exc).__name__, status=500, type="InternalServerError"))


def _outcome(planner: Planner, ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation | Exception:
    try:
        return planner(ctx, body, headers)
    except Exception as exc:
        return exc


async def _async(items: Iterable[str]) -> AsyncGenerator[str, None]:
    for item in items:
        yield item


async def read_body(request: Request) -> Any:
    return parse_json_body(await request.body(), request.headers.get("content-type", ""))


class Endpoints:
    def __init__(self, ctx: Context, stats: SimulatorStats) -> None:
        self.ctx = ctx
        self.stats = stats
        kv = stats.kv if ctx.settings.kv_capacity_tokens is not None else None
        self.engine = Engine(ctx.tokenizer.pieces, ctx.settings.ttft_s, ctx.settings.itl_s, kv)
        # vLLM renders and tokenizes prompts in one worker thread (its _tokenizer_executor), not on the event loop,
        # and cancels a request whose client leaves meanwhile (with_cancellation); so do we.
        self._tokenizing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sim-tokenize")
        self.paused = False  # POST /pause (0.33+): new requests are refused until POST /resume

    async def _off_loop(self, work: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, work)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, plan_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, plan_completion)

    async def responses(self, request: Request) -> Response:
        return await self._generate(request, plan_responses)

    async def retrieve(self, request: Request) -> Response:
        return self._stored(lambda store, rid: store.retrieve(rid), request)

    async def cancel(self, request: Request) -> Response:
        return self._stored(lambda store, rid: store.cancel(rid), request)

    def _stored(self, reach: Callable[[ResponseStore, str], dict[str, Any]], request: Request) -> Response:
        rid = request.path_params["response_id"]
        try:
            return JSONResponse(reach(self.ctx.store if self.ctx.store is not None else ResponseStore(), rid))
        except ApiError as error:
            return error_response(error)

    async def batch(self, request: Request) -> Response:
        return await self._generate(request, plan_batch)

    async def generate_tokens(self, request: Request) -> Response:
        return await self._generate(request, plan_generate)

    def audio(self, task: Task) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            tracker = self.stats.start(request.headers.get("x-request-id"))
            try:
                raw = await request.body()
                heard = await hear(request, task)
                spoken = plan_audio(self.ctx, heard, task, request.headers)
            except ApiError as error:
                tracker.finish("rejected")
                return error_response(error)
            # a form is recorded by the fields vLLM's model holds, and the hashes of its audio and of its bytes
            self.stats.record_body({"form": spoken.fields, "file_bytes": spoken.file_bytes,
                                    "file_sha256": hashlib.sha256(heard.audio).hexdigest(),
                                    "sha256": hashlib.sha256(raw).hexdigest()})  # fmt: skip
            tracker.generated(len(spoken.output))
            if spoken.stream:
                return TrackedStream(_async(spoken_events(spoken)), tracker)
            tracker.finish("completed")
            return JSONResponse(spoken_answer(spoken))

        return route

    async def messages(self, request: Request) -> Response:
        return await self._generate(request, plan_messages, anthropic=True)

    async def invocations(self, request: Request) -> Response:
        """SageMaker's route, behind model_hosting_container_standards' inject_adapter_id: the body's model becomes
        the X-Amzn-SageMaker-Adapter-Identifier header's (the first, any case), or null without one."""
        body = await read_body(request)
        if isinstance(body, dict):
            body = {**body, "model": request.headers.get("X-Amzn-SageMaker-Adapter-Identifier")}
        try:
            kind = pooling_invocation(body)
        except ApiError:
            kind = None  # the generate path answers it
        if kind is not None:
            return await self._pool(request, kind, body)
        return await self._generate(request, plan_invocation, body=body)

    def pooled(self, kind: Kind) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await self._pool(request, kind)

        return route

    async def cohere_embed(self, request: Request) -> Response:
        return await self._pool(request, None)

    async def decisions(self, request: Request) -> Response:
        return await self._pool(request, None, work=decide)

    async def _pool(
        self, request: Request, kind: Kind | None, read: Any = None, work: Worker | None = None
    ) -> Response:
        """A pooling route (`kind`), or one answered whole by `work` (Cohere's /v2/embed, the Decisions API);
        `read`: the body as a decorator rewrote it."""

        async def answer() -> Any:
            body = await read_body(request) if read is None else read
            self.stats.record_body(body)
            job = partial(work or cohere_embed, self.ctx, body, dict(request.headers)) if kind is None else \
                partial(pool, self.ctx, body, kind, dict(request.headers))  # fmt: skip
            return await self._off_loop(job)

        orjson_routes = kind in ("embeddings", "pooling") or (kind is None and work is None)
        return await self._answered(self.stats.start(), answer, self.ctx.profile.pools_with_orjson and orjson_routes)

    async def _answered(self, tracker: Any, answer: Callable[[], Awaitable[Any]], orjson: bool) -> Response:
        """A JSON route's answer, or its error as vLLM writes it; `orjson`: written as vLLM 0.33+'s
        create_json_response writes it."""
        try:
            result = await answer()
        except ApiError as error:
            tracker.finish("rejected")
            return error_response(error)
        except Exception as exc:
            tracker.finish("rejected")
            return internal_error(exc)
        tracker.finish("completed")
        if orjson:
            return Response(orjson_dumps(result), media_type="application/json")
        return JSONResponse(result)

    def rendered(self, route: RenderRoute) -> Callable[[Request], Awaitable[Response]]:
        """A render route: the prompt rendered and tokenized, nothing generated (0.33+ writes it with orjson)."""

        async def handler(request: Request) -> Response:
            async def answer() -> Any:
                body = await read_body(request)
                self.stats.record_body(body)
                return await self._off_loop(partial(render, self.ctx, route, body, dict(request.headers)))

            tracker = self.stats.start(request.headers.get("x-request-id"))
            return await self._answered(tracker, answer, self.ctx.profile.pools_with_orjson)

        return handler

    async def count_tokens(self, request: Request) -> Response:
        try:
            body = await read_body(request)
            return JSONResponse(await self._off_loop(partial(count_tokens, self.ctx, body)))
        except ApiError as error:
            return error_response(error, True, self.ctx.profile.anthropic_error_types)

    async def _generate(
        self, request: Request, planner: Planner, anthropic: bool = False, body: Any = None
    ) -> Response:
        tracker = self.stats.start(request.headers.get("x-request-id"))
        try:
            return await self._run(request, planner, tracker, anthropic, body)
        except BaseException:
            tracker.finish("aborted")  # client gone while the body was read, or server shutdown
            raise

    async def _run(
        self, request: Request, planner: Planner, tracker: RequestTracker, anthropic: bool, read: Any
    ) -> Response:
        try:
            body = await read_body(request) if read is None else read
            self.stats.record_body(body)
            plan = partial(_outcome, planner, self.ctx, body, request.headers)
            planned = await run_unless_disconnected(request.receive, lambda: self._off_loop(plan))
            if planned is None:  # the client left while its prompt was rendered and tokenized
                tracker.finish("aborted")
                return Response()
            if isinstance(planned, Exception):  # raised here, not inside the task group (which would group it)
                raise planned
            generation = planned
        except ApiError as error:
            tracker.finish("rejected")
            return error_response(error, anthropic, self.ctx.profile.anthropic_error_types)
        except Exception as exc:
            tracker.finish("rejected")
            return internal_error(exc)
        refused = PAUSED if self.paused else QUEUE_FULL if self._queue_full() else None
        if refused is not None:  # a stream has begun by then: vLLM answers 200 with the error as its first event
            streams = ("chat", "completion", "messages") if refused is PAUSED else ("chat", "completion")
            if not (generation.stream and generation.endpoint in streams):
                tracker.finish("rejected")
                return error_response(refused, anthropic, self.ctx.profile.anthropic_error_types)
            generation = replace(generation, engine_error=refused)
        profile = self.ctx.profile
        wire = Wire(generation, self.ctx.fingerprint, profile.omits_null_details, profile.streams_transfer_params)
        engine = self.engine
        if generation.engine_error is None:
            tracker.occupy(generation.kv_tokens)
        if generation.stream:
            stream = events(generation, wire, engine, tracker, self.ctx.profile.anthropic_error_types)
            return TrackedStream(stream, tracker, failed=generation.engine_error is not None)
        if generation.engine_error is not None:
            tracker.finish("rejected")
            return error_response(generation.engine_error)
        work = partial(generate_body, generation, wire, engine, tracker)
        store = self.ctx.store  # a background request reaches here only with the store on (plan_responses)
        if store is not None and generation.endpoint == "responses" and (generation.request or {}).get("background"):
            return JSONResponse(store.start(generation, partial(_tracked, work, tracker)))
        result = await work() if engine.instant else await run_unless_disconnected(request.receive, work)
        if result is None:
            tracker.finish("aborted")
            return Response()
        tracker.finish("completed")
        return JSONResponse(result)

    def _queue_full(self) -> bool:
        """vLLM's check_admission (--max-num-queued-reqs): the unfinished requests besides this one, plus it."""
        limit = self.ctx.settings.max_num_queued_reqs
        return limit is not None and self.stats.active > limit

    async def tokenize(self, request: Request) -> Response:
        return await self._utility(request, tokenize)

    async def detokenize(self, request: Request) -> Response:
        return await self._utility(request, detokenize)

    async def _utility(self, request: Request, handler: Callable[[Context, Any], dict[str, Any]]) -> Response:
        try:
            body = await read_body(request)
            return JSONResponse(await self._off_loop(partial(handler, self.ctx, body)))
        except ApiError as error:
            return error_response(error)
        except Exception as exc:
            return internal_error(exc)

    async def pause(self, request: Request) -> Response:
        """0.33's POST /pause?mode=abort|wait|keep: new requests refused with a retryable 503 until /resume. The
        generations under way finish (as `wait`); `keep`, which queues new requests instead, is not imitated."""
        mode = request.query_params.get("mode", "abort")
        if mode not in PAUSE_MODES:
            error = f"mode must be one of {', '.join(PAUSE_MODES)}"
            return JSONResponse({"detail": [{"loc": ["query", "mode"], "msg": error}]}, status_code=422)
        if mode == "keep":
            return JSONResponse({"error": "the simulator does not imitate pause mode keep"}, status_code=400)
        self.paused = True
        return JSONResponse({"status": "paused"})

    async def resume(self, request: Request) -> Response:
        self.paused = False
        return JSONResponse({"status": "resumed"})

    async def is_paused(self, request: Request) -> Response:
        return JSONResponse({"is_paused": self.paused})

    async def models(self, request: Request) -> Response:
        return JSONResponse(model_list(self.ctx.settings))

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": self.ctx.settings.vllm_version})

    async def metrics(self, request: Request) -> Response:
        """Prometheus text; of vLLM's metrics only vllm:cache_config_info, with a KV capacity to report."""
        capacity = self.ctx.settings.kv_capacity_tokens
        text = "" if capacity is None else cache_config_info(self.ctx.profile.cache_info_labels, capacity)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def sim_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats.snapshot())

    async def sim_reset(self, request: Request) -> Response:
        self.stats.reset()
        return JSONResponse(self.stats.snapshot())


async def _tracked(work: Callable[[], Awaitable[dict[str, Any]]], tracker: RequestTracker) -> dict[str, Any]:
    """A background generation, its end recorded as a request's (cancelled: aborted)."""
    try:
        result = await work()
    except BaseException:
        tracker.finish("aborted")
        raise
    tracker.finish("completed")
    return result


def model_list(settings: SimulatorSettings) -> dict[str, Any]:
    now = int(time.time())
    permission = {
        "id": f"modelperm-{uuid.uuid4().int & (2**64 - 1):016x}",
        "object": "model_permission",
        "created": now,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    cards = [{
        "id": name,
        "object": "model",
        "created": now,
        "owned_by": "vllm",
        "root": settings.model_root,
        "parent": None,
        "max_model_len": settings.max_model_len,
        "permission": [permission],
    } for name in settings.served]  # fmt: skip
    return {"object": "list", "data": cards}


async def http_error(request: Request, exc: Exception) -> Response:
    # Starlette answers unknown routes and wrong methods in plain text; vLLM (FastAPI) answers in JSON.
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _pause_routes(endpoints: Endpoints) -> list[Route]:
    """vLLM's /pause, /resume and /is_paused, where the profile's engine refuses requests while paused."""
    if not endpoints.ctx.profile.refuses_while_paused:
        return []
    return [
        Route("/pause", endpoints.pause, methods=["POST"]),
        Route("/resume", endpoints.resume, methods=["POST"]),
        Route("/is_paused", endpoints.is_paused, methods=["GET"]),
    ]


def _render_routes(endpoints: Endpoints) -> list[Route]:
    """With --enable-scale-out the render routes; without, 0.32+ answers them 403 and 0.31 does not know them."""
    if endpoints.ctx.settings.enable_scale_out:
        return [Route(path, endpoints.rendered(route), methods=["POST"]) for path, route in PATHS.items()]
    if not endpoints.ctx.profile.forbids_scale_out_off:
        return []

    async def disabled(request: Request) -> Response:
        return error_response(ApiError(DISABLED, status=403, type="PermissionDeniedError"))

    return [Route(path, disabled, methods=["POST"]) for path in PATHS]


def create_app(settings: SimulatorSettings) -> Starlette:
    """Load the tokenizer and build the app; `app.state.stats` counts what reaches it."""
    stats = SimulatorStats(settings.kv_capacity_tokens)
    endpoints = Endpoints(Context.load(settings), stats)
    merges_inline_system(endpoints.ctx)  # vLLM probes the template as it starts: 0.31-0.33 may fail to start here
    routes = [
        Route("/v1/chat/completions", endpoints.chat, methods=["POST"]),
        Route("/v1/completions", endpoints.completions, methods=["POST"]),
        Route("/v1/responses", endpoints.responses, methods=["POST"]),
        Route("/v1/responses/{response_id}", endpoints.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}/cancel", endpoints.cancel, methods=["POST"]),
        Route("/v1/messages", endpoints.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", endpoints.count_tokens, methods=["POST"]),
        Route("/invocations", endpoints.invocations, methods=["POST"]),
        Route("/v1/chat/completions/batch", endpoints.batch, methods=["POST"]),
        Route("/inference/v1/generate", endpoints.generate_tokens, methods=["POST"]),
        Route("/v1/audio/transcriptions", endpoints.audio("transcribe"), methods=["POST"]),
        Route("/v1/audio/translations", endpoints.audio("translate"), methods=["POST"]),
        Route("/v2/embed", endpoints.cohere_embed, methods=["POST"]),
        *(
            [Route("/v1/decisions", endpoints.decisions, methods=["POST"])]
            if endpoints.ctx.profile.serves_decisions
            else []
        ),  # fmt: skip
        *[Route(path, endpoints.pooled(kind), methods=["POST"]) for path, kind in POOLING_KINDS.items()],
        Route("/v1/models", endpoints.models, methods=["GET"]),
        Route("/tokenize", endpoints.tokenize, methods=["POST"]),
        Route("/detokenize", endpoints.detokenize, methods=["POST"]),
        Route("/health", endpoints.health, methods=["GET"]),
        Route("/version", endpoints.version, methods=["GET"]),
        Route("/metrics", endpoints.metrics, methods=["GET"]),
        *_pause_routes(endpoints),
        *_render_routes(endpoints),
        Route("/sim/stats", endpoints.sim_stats, methods=["GET"]),
        Route("/sim/reset", endpoints.sim_reset, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if endpoints.ctx.store is not None:
            await endpoints.ctx.store.close()  # vLLM's shutdown ends the background generations it runs

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.stats = stats
    app.state.settings = settings
    app.state.store = endpoints.ctx.store
    return app

"""Every path token-guard serves, declared once: its methods, what the guard does with it, who may call it, what it
charges and its error envelope. A path that is not here is a 404 and never reaches the upstream (deny by default).

    kind        what the guard does                                    key           charged to the key
    generate    count, decide (clamp, reject, truncate, chunk), admit   client key    input + reserved output, one
                by KV cost, forward; settled from the answer's usage                  request; settled on usage
    pool        count each input, decide, admit by input tokens         client key    its input tokens, one request
    count       count only: answered by the guard (count_tokens) or     client key    the tokens counted, one request
                forwarded to vLLM's renderer unchanged
    relay       read-only utilities, forwarded unchanged                client key    one request, no token
    own         the guard's own probes and metrics                      none          nothing
    control     vLLM's administrative routes (sleep, RPCs, LoRA, ...)   admin key     nothing
    unguarded   vLLM generates here in a form the guard cannot count    nobody        (closed: 404 with the reason)

The routes are vLLM 0.31's to 0.34's (tests/api/test_routes.py holds their route tables and fails when one is not
declared here); a route a later release added says which (`since`): in front of an older vLLM it is vLLM's 404.
`server.passthrough_paths` adds relay routes of the operator's own; it never opens a route the table declares
otherwise, except an unguarded one, which the operator then opens on purpose.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from proxy.error_bodies import ANTHROPIC, Envelope


class Kind(StrEnum):
    GENERATE = "generate"
    POOL = "pool"
    COUNT = "count"
    RELAY = "relay"
    OWN = "own"
    CONTROL = "control"
    UNGUARDED = "unguarded"


class Reads(StrEnum):
    """The wire model that reads a guarded route's body; the guard's recipe for it (policy/guard.py, RECIPES)."""

    CHAT = "chat"
    COMPLETION = "completion"
    RESPONSES = "responses"
    MESSAGES = "messages"
    COUNT_TOKENS = "count_tokens"  # an Anthropic Messages body read for its count
    INVOCATIONS = "invocations"  # SageMaker: one of the others, chosen from the body (api/invocations.py)
    CHAT_BATCH = "chat_batch"
    TOKENS = "tokens"
    AUDIO = "audio"  # a multipart form, not JSON
    EMBEDDINGS = "embeddings"
    POOLING = "pooling"
    CLASSIFY = "classify"
    SCORE = "score"
    RERANK = "rerank"
    COHERE_EMBED = "cohere_embed"
    DECISIONS = "decisions"  # vLLM 0.33's Decisions API: one engine request per question


class Access(StrEnum):
    OPEN = "open"  # nobody needs a key
    CLIENT = "client"  # a key of server.api_keys or [[keys]], when any is configured
    ADMIN = "admin"  # a key of server.admin_api_keys; without one configured, nobody
    METRICS = "metrics"  # anyone; key names and usage only with server.metrics_api_key (see server/metrics.py)
    NOBODY = "nobody"


ACCESS = {
    Kind.GENERATE: Access.CLIENT, Kind.POOL: Access.CLIENT, Kind.COUNT: Access.CLIENT, Kind.RELAY: Access.CLIENT,
    Kind.OWN: Access.OPEN, Kind.CONTROL: Access.ADMIN, Kind.UNGUARDED: Access.NOBODY,
}  # fmt: skip
GUARDED = frozenset({Kind.GENERATE, Kind.POOL, Kind.COUNT})  # the guard reads, counts and charges the body

GET = frozenset({"GET", "HEAD"})
POST = frozenset({"POST"})


@dataclass(frozen=True, slots=True)
class Route:
    path: str
    methods: frozenset[str]
    kind: Kind
    reads: Reads | None = None  # the wire model that reads a guarded route's body (policy/guard.py dispatches on it)
    envelope: Envelope = Envelope.OPENAI  # the envelope of its error answers (error_bodies.py)
    answered: bool = False  # a count route the guard answers itself instead of forwarding
    access: Access | None = None  # None: the kind's (ACCESS)
    since: tuple[int, int] | None = None  # the vLLM release that added it: before it, a 404 as vLLM answers

    @property
    def who(self) -> Access:
        return self.access if self.access is not None else ACCESS[self.kind]

    @property
    def guarded(self) -> bool:
        return self.kind in GUARDED


def _many(kind: Kind, reads: Reads | None, paths: Iterable[str], methods: frozenset[str] = POST) -> list[Route]:
    return [Route(path, methods, kind, reads) for path in paths]


POOLING = {
    "/v1/embeddings": Reads.EMBEDDINGS, "/pooling": Reads.POOLING, "/classify": Reads.CLASSIFY,
    "/score": Reads.SCORE, "/v1/score": Reads.SCORE, "/rerank": Reads.RERANK, "/v1/rerank": Reads.RERANK,
    "/v2/rerank": Reads.RERANK, "/v2/embed": Reads.COHERE_EMBED,
}  # fmt: skip
CONTROL_POST = (
    "/sleep", "/wake_up", "/release_kv_cache_memory", "/collective_rpc", "/pause", "/resume", "/abort_requests",
    "/inference/v1/abort_requests", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/reset_prefix_cache",
    "/reset_mm_cache", "/reset_encoder_cache", "/start_profile", "/stop_profile", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/init_weight_transfer_engine", "/shutdown_weight_transfer_engine",
    "/start_weight_update", "/start_draft_weight_update", "/update_weights", "/finish_weight_update",
    "/update_weight_version", "/weight_checker", "/fault_tolerance/apply", "/v1/fault_tolerance/apply",
    "/checkpoint/prepare", "/checkpoint/restore",
)  # fmt: skip
CONTROL_GET = (
    "/server_info", "/is_sleeping", "/is_paused", "/get_world_size", "/weight_info", "/fault_tolerance/status",
    "/kv_event_sources", "/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/static", "/ready", "/readyz",
    "/v1/fault_tolerance/status", "/checkpoint/status",
)  # fmt: skip
UNGUARDED = (  # generation the guard cannot count or clamp in the form vLLM takes it
    "/cohere/v2/chat", "/generative_scoring", "/v1/systemone", "/v1/realtime",
)  # fmt: skip

ROUTES: tuple[Route, ...] = (
    Route("/health", GET, Kind.OWN),
    Route("/livez", GET, Kind.OWN),
    Route("/ping", GET | POST, Kind.OWN),  # SageMaker's probe: the guard's readiness, as /health
    Route("/metrics", GET, Kind.OWN, access=Access.METRICS),
    Route("/v1/chat/completions", POST, Kind.GENERATE, Reads.CHAT),
    Route("/v1/completions", POST, Kind.GENERATE, Reads.COMPLETION),
    Route("/v1/responses", POST, Kind.GENERATE, Reads.RESPONSES),
    Route("/v1/messages", POST, Kind.GENERATE, Reads.MESSAGES, Envelope.ANTHROPIC),
    Route("/invocations", POST, Kind.GENERATE, Reads.INVOCATIONS),
    Route("/v1/chat/completions/batch", POST, Kind.GENERATE, Reads.CHAT_BATCH),
    Route("/inference/v1/generate", POST, Kind.GENERATE, Reads.TOKENS),
    Route("/v1/audio/transcriptions", POST, Kind.GENERATE, Reads.AUDIO),
    Route("/v1/audio/translations", POST, Kind.GENERATE, Reads.AUDIO),
    Route("/v1/decisions", POST, Kind.GENERATE, Reads.DECISIONS, since=(0, 33)),  # a prompt and 1 token per question
    *[Route(path, POST, Kind.POOL, reads) for path, reads in POOLING.items()],
    Route("/v1/messages/count_tokens", POST, Kind.COUNT, Reads.COUNT_TOKENS, Envelope.ANTHROPIC, answered=True),
    Route("/v1/chat/completions/render", POST, Kind.COUNT, Reads.CHAT),
    Route("/v1/completions/render", POST, Kind.COUNT, Reads.COMPLETION),
    Route("/v1/responses/render", POST, Kind.COUNT, Reads.RESPONSES),
    Route("/v1/messages/render", POST, Kind.COUNT, Reads.COUNT_TOKENS, Envelope.ANTHROPIC),
    Route("/cohere/v2/chat/render", POST, Kind.UNGUARDED),
    Route("/v1/models", GET, Kind.RELAY),
    Route("/version", GET, Kind.RELAY),
    Route("/load", GET, Kind.RELAY),
    Route("/tokenizer_info", GET, Kind.RELAY),
    *_many(Kind.RELAY, None, ("/tokenize", "/detokenize", "/v1/chat/completions/derender", "/v1/completions/derender")),
    *_many(Kind.CONTROL, None, CONTROL_POST),
    *_many(Kind.CONTROL, None, CONTROL_GET, GET),
    *_many(Kind.UNGUARDED, None, UNGUARDED, GET | POST),
)


def render_only(routes: Iterable[Route] = ROUTES) -> tuple[Route, ...]:
    """`token-guard render`'s table: the guard's own routes and the count routes it answers itself (the render routes
    with render.local, count_tokens); nothing reaches an upstream."""
    return tuple(r for r in routes if r.kind is Kind.OWN or (r.kind is Kind.COUNT and r.reads is not None))


# Routes with an id in their path; the id must be a plain token, so that what is forwarded is always a path of the
# table's own shape.
ID = "[A-Za-z0-9][A-Za-z0-9._:-]{0,255}"
TEMPLATES: tuple[tuple[re.Pattern[str], Route], ...] = (
    (re.compile(f"/v1/responses/{ID}"), Route("/v1/responses/{response_id}", GET, Kind.RELAY)),
    (re.compile(f"/v1/responses/{ID}/cancel"), Route("/v1/responses/{response_id}/cancel", POST, Kind.RELAY)),
)
TEMPLATE_PREFIXES = ("/v1/responses/",)


@dataclass(frozen=True, slots=True)
class Found:
    """A request's route, and the path to forward: the route's own, or the request's for a route with an id."""

    route: Route
    path: str


class RouteTable:
    def __init__(
        self, routes: Iterable[Route] = ROUTES, passthrough: Iterable[str] = (), templates: bool = True
    ) -> None:
        self._exact = {route.path: route for route in routes}
        self.kept: list[Route] = []  # passthrough paths the table declares otherwise: left as declared
        self.unguarded: list[str] = []  # passthrough paths that open unguarded generation, on purpose
        for path in passthrough:  # the operator's own read-only routes (server.passthrough_paths)
            declared = self._exact.get(path)
            if declared is not None and declared.kind is not Kind.UNGUARDED:
                self.kept.append(declared)
                continue
            if declared is not None:
                self.unguarded.append(path)
            self._exact[path] = Route(path, GET | POST, Kind.RELAY)
        self._found = {path: Found(route, path) for path, route in self._exact.items()}
        self._templates = TEMPLATES if templates else ()

    def speak(self, anthropic_types: bool) -> None:
        """The Messages API's error vocabulary, as the upstream's release answers there (the start-up check tells
        it: ModelRegistry.anthropic_error_types): Anthropic's own types from vLLM 0.33, vLLM's exception names
        before and while the release is not known. Every answer of the guard's own on those routes, from either
        front end, reads it from the route it found."""
        new = Envelope.ANTHROPIC_TYPES if anthropic_types else Envelope.ANTHROPIC
        for path, route in self._exact.items():
            if route.envelope in ANTHROPIC and route.envelope is not new:
                self._exact[path] = replace(route, envelope=new)
                self._found[path] = Found(self._exact[path], path)

    def find(self, path: str) -> Found | None:
        """The route of a request's (decoded) path; a trailing slash is the route without it, as vLLM redirects it."""
        found = self._found.get(path)
        if found is not None:
            return found
        if len(path) > 1 and path[-1] == "/":
            return self._found.get(path[:-1]) or self._template(path[:-1])
        return self._template(path)

    def _template(self, path: str) -> Found | None:
        if not path.startswith(TEMPLATE_PREFIXES):
            return None
        for pattern, route in self._templates:
            if pattern.fullmatch(path):
                return Found(route, path)
        return None

    def routes(self) -> list[Route]:
        return [*self._exact.values(), *(route for _, route in self._templates)]

    def declares(self, path: str) -> Route | None:
        """The route declared for a path as vLLM writes it in its own table (with `{id}` placeholders)."""
        return self._exact.get(path) or next((r for _, r in self._templates if r.path == path), None)

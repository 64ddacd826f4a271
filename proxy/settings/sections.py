"""The settings' sections as frozen value objects: what each key holds and its default. Built and validated once by
`load_settings()` (proxy/settings/loader.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    log_level: str = "info"
    log_format: str = "text"
    api_keys: tuple[str, ...] = ()
    admin_api_keys: tuple[str, ...] = ()  # the only keys that reach vLLM's administrative routes (api/routes.py)
    metrics_api_key: str | None = None  # shows key names, usage and models in /metrics and /health (as admin keys do)
    passthrough_paths: tuple[str, ...] = ()  # more read-only routes relayed unchanged (with a client key)
    max_body_bytes: int = 32 * 2**20
    max_held_body_bytes: int = 128 * 2**20  # the bodies of all requests at once, read or being read: 503 past it
    max_json_depth: int = 64
    max_json_values: int = 2**17  # array items and object members: a prompt of token ids takes one per token
    max_messages: int = 10_000
    ready_wait_s: float = 10.0  # a guarded request that arrives before the guard knows how the upstream counts waits
    drain_timeout_s: float = 20.0  # shorter than Kubernetes' default grace period (30 s), with room for a preStop pause
    read_timeout_s: float = 30.0  # a request's headers, and its body, must arrive within this
    write_timeout_s: float = 30.0  # a client that leaves the guard's writes unread this long is disconnected
    workers: int = 1  # processes serving one port; each takes an equal share of the admission budget


@dataclass(frozen=True)
class UpstreamSettings:
    # Replicas of the same model, from upstream.urls (a list, or comma-separated) or upstream.url (one, or several
    # comma-separated: `--upstream a,b`), parsed into this tuple once by the loader.
    urls: tuple[str, ...] = ("http://127.0.0.1:8000",)
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 600.0
    read_timeout_s: float = 600.0  # the longest silence allowed between two pieces of an answer
    startup_wait_s: float = 300.0
    retries: int = 2
    health_interval_s: float = 5.0


@dataclass(frozen=True)
class AdmissionSettings:
    max_inflight_tokens: int | str = 0  # 0: off; "auto": from the upstream's KV cache size
    max_inflight_requests: int = 0
    queue_timeout_s: float = 30.0
    max_queue: int = 1000
    # `background: true` on /v1/responses: "follow" holds its ticket (and a limited key's reservation) until vLLM says
    # it ended, polling its replica every background_poll_s, at most background_max_s; "refuse": a 400 while admission
    # keeps a budget
    background: str = "follow"
    background_poll_s: float = 1.0
    background_max_s: float = 3600.0


@dataclass(frozen=True)
class RedisSettings:
    """The Redis a fleet of guards keeps its state in (proxy/fleet/): admission budgets, key quotas, presence. Every
    guard and worker pointed at the same one shares each replica's whole budget and each key's buckets."""

    url: str | None = None  # None: no fleet, each process keeps its own budget share and buckets
    failure: str = "open"  # Redis unreachable: "open" admits on this process's share, "closed" answers 503
    timeout_ms: int = 250  # the longest any one Redis call may take
    lease_s: float = 30.0  # a reservation or heartbeat not renewed for this long is dropped (its guard died)
    # Credit in blocks: each process may hold this share of a replica's whole budget, divided by the processes sharing
    # it, and admits requests that fit in it without a round trip to Redis; 0: every request takes the round trip.
    block_share: float = 0.5


@dataclass(frozen=True)
class ResponsesSettings:
    """The ledger of stored responses (policy/ledger.py): what the guard remembers of each response vLLM stores, so
    that a continued turn is counted whole, sent to the replica that holds it, and reached only by its key. In this
    process's memory, or in Redis when redis.url is set."""

    ttl_s: float = 3600.0  # an entry is forgotten this long after it was written (its next turn is then partial)
    max_bytes: int = 64 * 2**20  # the entries' encoded size, all together: past it the oldest are evicted


@dataclass(frozen=True)
class ExtprocSettings:
    """`token-guard extproc`: the guard as Envoy's external processor (gRPC), on server.host."""

    port: int = 9002
    chunk_instead: str = "reject"  # what the chunk policy becomes there: "reject" (a 400 saying why) or "truncate"
    # true only where GIE's endpoint picker runs before the guard and sets x-gateway-destination-endpoint: admission
    # charges the pod it names; false: the header can only be a client's, removed before the upstream and ignored
    picker_sets_destination: bool = False
    # gateway path prefixes the processor takes off `:path` itself ("/llama": /llama/v1/models goes up as /v1/models)
    path_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RenderSettings:
    """vLLM's render routes (/v1/chat/completions/render and the others): answered by the guard from its own
    tokenization, or forwarded to the upstream (which serves them only with --enable-scale-out)."""

    local: bool = False
    cache_mb: float = 64.0  # the token ids of already-rendered prompt pieces (per tokenizer, made on first render)
    # `token-guard render`: only the render routes and the guard's own, no upstream asked; [[models]] with their
    # max_model_len say what it renders, `vllm_version` the release whose rules and answer shape it follows
    only: bool = False
    vllm_version: str | None = None


REDIS_FAILURE_MODES = ("open", "closed")


class Overflow(StrEnum):
    """What the guard does with a prompt over the window (policy.on_overflow, the x-token-guard-overflow header)."""

    REJECT = "reject"  # the overflow 400
    TRUNCATE = "truncate"  # cut to fit
    CHUNK = "chunk"  # split, each chunk its own request, the answers merged


OVERFLOW_POLICIES = tuple(policy.value for policy in Overflow)


@dataclass(frozen=True)
class PolicySettings:
    min_output_tokens: int = 1
    default_max_tokens: int | str | None = None
    on_overflow: str = "reject"
    allow_client_override: bool = True
    truncate_side: str = "left"
    chunk_tokens: int = 2048
    chunk_overlap: int = 0
    chunk_prompt: str | None = None
    chunk_separator: str = "\n\n"
    chunk_merge: str = "concat"
    max_fanout: int = 4
    # The share of the window a clamp keeps free for the next turn, per route (policy/decide.py): agents re-send the
    # conversation with an answer that filled its limit appended (Claude Code, Qwen Code and Codex-style clients do),
    # so a limit of all the room left makes their continuation overflow. 0: the clamp gives all the room.
    next_turn_share_messages: float = 0.5
    next_turn_share_responses: float = 0.5
    next_turn_share_chat: float = 0.0
    # A chat_template sent in a request is refused, as vLLM refuses it without --trust-request-chat-template; when
    # trusted, it renders in a child process with a time and memory limit (counting/isolated.py).
    trust_request_chat_template: bool = False
    reduce_prompt: str = (
        "Below are answers to consecutive parts of one long input. Combine them into a single answer.\n\n{answers}"
    )


COUNT_SOURCES = ("auto", "local", "upstream")
TOKENIZER_MODES = ("auto", "hf", "mistral")


@dataclass(frozen=True)
class CountingSettings:
    cache_mb: float = 64.0
    word_cache_mb: float = 16.0
    split_min_chars: int = 16384
    # Who counts a prompt: "local" (the guard), "upstream" (vLLM renders and counts it), or "auto": local where the
    # start-up check agreed with what vLLM charges, the upstream for other models and for images or audio.
    source: str = "auto"


@dataclass(frozen=True)
class ModelSettings:
    name: str
    tokenizer: str
    chat_template: Path | None = None
    max_model_len: int | None = None
    policy: PolicySettings | None = None  # the global policy with this model's [models.policy] overrides
    tokenizer_mode: str = "auto"  # as vLLM's --tokenizer-mode: "auto" (decide as vLLM does), "hf" or "mistral"
    default_chat_template_kwargs: dict[str, Any] | None = None  # as vLLM's --default-chat-template-kwargs
    reasoning_effort_map: dict[str, str] | None = None  # as vLLM's --reasoning-effort-map (0.33+)
    count_source: str | None = None  # this model's counting.source


@dataclass(frozen=True)
class KeySettings:
    """A named API key ([[keys]]) and its quotas; only the SHA-256 of the key is kept."""

    name: str
    key_sha256: str
    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    max_output_tokens: int | None = None  # caps every request's output limit, as the window's room does
    models: tuple[str, ...] | None = None  # the models it may use; None: all
    prompt_embeds: bool = True  # may send prompt_embeds (tensors vLLM runs in place of text: --enable-prompt-embeds)

    @property
    def limited(self) -> bool:
        return self.tokens_per_minute is not None or self.requests_per_minute is not None


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    counting: CountingSettings = field(default_factory=CountingSettings)
    admission: AdmissionSettings = field(default_factory=AdmissionSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    responses: ResponsesSettings = field(default_factory=ResponsesSettings)
    extproc: ExtprocSettings = field(default_factory=ExtprocSettings)
    render: RenderSettings = field(default_factory=RenderSettings)
    models: tuple[ModelSettings, ...] = ()
    keys: tuple[KeySettings, ...] = ()

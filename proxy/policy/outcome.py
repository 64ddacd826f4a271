"""What the guard makes of a request: forward a body, refuse it, or fan it out in chunks; and the decision behind it,
which both the x-token-guard-* headers and the request's log line and metrics are made from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.api.body import with_changes
from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.source import CountSource
from proxy.errors import GuardError
from proxy.policy.decide import Action, Plan
from proxy.policy.ledger import NOBODY, Turn
from proxy.settings import PolicySettings
from proxy.settings.sections import KeySettings


@dataclass(frozen=True)
class Decision:
    action: str  # an Action (decide.py): pass, clamp, reject, truncate, chunk, partial, count, uncounted
    prompt_tokens: int
    max_tokens: int | None = None  # the effective output limit, when there is one
    chunk_tokens: tuple[int, ...] = ()  # chunk: each chunk's prompt tokens
    dropped_messages: int | None = None  # truncate
    truncated_tokens: int | None = None  # truncate
    count_source: str | None = None  # who counted the prompt: a CountSource (counting/source.py)
    thinking: str | None = None  # Anthropic thinking under a lowered limit: "budget_tokens=N" or "disabled"
    next_turn: int | None = None  # clamp: the tokens of the window kept free for the next turn (decide.py)
    render: str | None = None  # a render route with render.local: "local", or "upstream; reason=..." (rendered.py)

    @classmethod
    def of(cls, plan: Plan, count_source: str | None = None) -> Decision:
        return cls(plan.action, plan.prompt_tokens, plan.max_tokens, count_source=count_source,
                   next_turn=plan.next_turn)  # fmt: skip

    @property
    def chunks(self) -> int | None:
        return len(self.chunk_tokens) or None

    def headers(self) -> dict[str, str]:
        headers = {}
        if self.action != Action.UNCOUNTED:  # forwarded without a count: no number to tell
            headers["x-token-guard-prompt-tokens"] = str(self.prompt_tokens)
        headers["x-token-guard-action"] = self.action
        if self.max_tokens is not None:
            headers["x-token-guard-max-tokens"] = str(self.max_tokens)
        if self.chunk_tokens:
            headers["x-token-guard-chunks"] = str(len(self.chunk_tokens))
            headers["x-token-guard-chunk-tokens"] = ",".join(str(n) for n in self.chunk_tokens)
        if self.dropped_messages is not None:
            headers["x-token-guard-dropped-messages"] = str(self.dropped_messages)
        if self.truncated_tokens is not None:
            headers["x-token-guard-truncated-tokens"] = str(self.truncated_tokens)
        if self.count_source is not None:
            headers["x-token-guard-count-source"] = self.count_source
        if self.thinking is not None:
            headers["x-token-guard-thinking"] = self.thinking
        if self.next_turn is not None:
            headers["x-token-guard-next-turn-tokens"] = str(self.next_turn)
        if self.render is not None:
            headers["x-token-guard-render"] = self.render
        return headers


@dataclass(frozen=True)
class Forward:
    body: bytes
    decision: Decision
    cost: int | None = None  # KV tokens it holds while running, for admission
    content_type: str | None = None  # the body's own, in place of the client's (a form written anew)
    usage_asked: bool = False  # the body asks vLLM for a usage event its client did not ask for (usage_event.py)
    follows: str | None = None  # a background response's id: its ticket is held until vLLM says it ended


@dataclass(frozen=True)
class Refuse:
    error: GuardError
    decision: Decision


@dataclass(frozen=True)
class Answer:
    """The guard answers the request itself (Anthropic's count_tokens, a render route): a 200 with this JSON body."""

    body: bytes
    decision: Decision


@dataclass(frozen=True)
class Chunked:
    """A prompt split into chunks, each sent as its own request; their answers are merged into one."""

    kind: str  # "chat" or "completion"
    bodies: list[dict[str, Any]]
    costs: list[int]
    decision: Decision
    stream: bool
    include_usage: bool
    policy: PolicySettings
    original: ChatRequest | CompletionRequest


Outcome = Forward | Refuse | Chunked | Answer


@dataclass
class Findings:
    """What a guarded request's path learned, kept even when it fails part way: its log line and metrics."""

    model: str | None = None
    api_key: KeySettings | None = None  # the client's named API key ([[keys]]), set by the server's key check
    max_tokens_before: int | None = None
    count_s: float | None = None
    count_source: CountSource | None = None
    decision: Decision | None = None
    chunk_refused: bool = False  # its chunk policy became reject where the guard cannot fan out (Guard.chunk_instead)
    kept_whole: str | None = None  # why its truncate or chunk policy became reject (policy/choice.py, whole_prompt)
    owner: str = NOBODY  # the key that creates or reaches a stored response (policy/ledger.py), set by the front end
    turn: Turn | None = None  # a Responses create vLLM stores: recorded in the ledger from its answer
    expected: int | None = None  # the prompt tokens vLLM's usage should report, where the count is the whole prompt


def outcome_of(plan: Plan, body: dict[str, Any], raw: bytes, cost: int, source: str | None) -> Outcome:
    """The outcome a plan makes of a request: refused with its error, or forwarded (the body rewritten only when the
    plan changes a field, else the raw bytes as received)."""
    decision = Decision.of(plan, source)
    if plan.error is not None:
        return Refuse(plan.error, decision)
    return Forward(with_changes(body, plan.changes) if plan.changes else raw, decision, cost)

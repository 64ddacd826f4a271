"""The steps every endpoint's recipe shares: the request's target (its model, policy, overflow choice and limits), the
prompt's timed count, a request-borne chat template refused unless trusted, and cuts re-counted only for a prompt
counted here. A recipe (policy/<endpoint>.py) runs target, size floor (size.py), timed count, decision and cut."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol, TypeVar

from proxy.api.chat import ChatRequest
from proxy.api.routes import Reads
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.source import CountSource, RemoteCount, chat_tokens
from proxy.errors import ContextLengthExceeded, InvalidRequest
from proxy.policy.choice import choose_policy, whole_prompt
from proxy.policy.decide import Action, Limits, Plan, limits_for, next_turn_share
from proxy.policy.ledger import Ledger
from proxy.policy.outcome import Findings, Outcome
from proxy.policy.turns import CountItems
from proxy.settings import Overflow, PolicySettings, Settings

T = TypeVar("T")
UNTRUSTED_TEMPLATE = (  # vLLM's words, then the guard's switch
    "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with "
    "untrusted chat template. (token-guard: policy.trust_request_chat_template)"
)


class Target(NamedTuple):
    """What a request is for: its model, that model's policy, the overflow choice and the limits."""

    model: GuardedModel
    policy: PolicySettings
    choice: Overflow
    limits: Limits


@dataclass
class Steps:
    """What the recipes share: the settings, the models, the upstream's counting and the KV ceiling."""

    settings: Settings
    registry: ModelRegistry
    remote: RemoteCount | None = None  # counts through the upstream (counting.source); None: always local
    ceiling: Callable[[], int | None] | None = None  # the largest replica's whole KV budget (None: no token budget)
    chunk_instead: str | None = None  # a front end that cannot fan out: "reject" or "truncate" for chunk (None: chunk)
    ledger: Ledger | None = None  # the stored responses a Responses create continues (policy/ledger.py)

    def __post_init__(self) -> None:
        self._policies = {m.name: m.policy for m in self.settings.models if m.policy is not None}

    @property
    def max_messages(self) -> int:
        return self.settings.server.max_messages

    def policy_for(self, model: str) -> PolicySettings:
        return self._policies.get(model) or self.settings.policy

    def max_cost(self) -> int | None:
        return self.ceiling() if self.ceiling is not None else None

    def target(
        self, name: str | None, headers: Mapping[str, str], findings: Findings, body: Mapping[str, Any] | None = None,
        next_turn: Reads | None = None,
    ) -> Target:  # fmt: skip
        """The model a request is for, its policy, the overflow choice (config or header: reject for a `body` whose
        prompt must reach vLLM whole) and its limits (with the next turn's share of the route that reads
        `next_turn`)."""
        key = findings.api_key
        model = self.registry.resolve(name, key.models if key is not None else None)  # a 404 for one it may not use
        findings.model = model.name
        policy = self.policy_for(model.name)
        max_output = key.max_output_tokens if key is not None else None
        limits = limits_for(model.name, model.max_model_len, policy, max_output, self.max_cost())
        if next_turn is not None:
            limits = replace(limits, next_turn=next_turn_share(policy, next_turn))
        choice = choose_policy(policy, headers)
        why = whole_prompt(body) if choice is not Overflow.REJECT and body is not None else None
        if why is not None:
            choice, findings.kept_whole = Overflow.REJECT, f"The {choice} policy was not applied: {why}."
        if choice is Overflow.CHUNK and self.chunk_instead is not None:
            choice = Overflow(self.chunk_instead)
            findings.chunk_refused = choice is Overflow.REJECT
        return Target(model, policy, choice, limits)

    async def count(self, model: GuardedModel, req: ChatRequest, findings: Findings) -> int:
        """A chat prompt's count, timed, and who counted it."""
        return await timed(findings, chat_tokens(model, req, self.remote))


class Recipe(Protocol):
    """An endpoint's request path from its parsed body: target, size floor, timed count, decision, cut."""

    def __call__(
        self, steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Awaitable[Outcome]: ...


async def timed(findings: Findings, counting: Awaitable[tuple[T, CountSource]]) -> T:
    """A count, with its time and who counted it written to the request's findings."""
    started = time.perf_counter()
    counted, findings.count_source = await counting
    findings.count_s = time.perf_counter() - started
    return counted


def refuse_untrusted(policy: PolicySettings, req: ChatRequest) -> None:
    """vLLM's 400 for a chat template sent with the request, unless the policy trusts them."""
    brings = req.chat_template is not None or req.chat_template_kwargs.get("chat_template") is not None
    if brings and not policy.trust_request_chat_template:
        raise InvalidRequest(UNTRUSTED_TEMPLATE, param="chat_template")


def local_recount(findings: Findings, recount: CountItems) -> CountItems | None:
    # Truncation re-counts its cuts; only a locally counted prompt can be cut exactly.
    return recount if findings.count_source is CountSource.LOCAL else None


def fits_by_cutting(plan: Plan, choice: Overflow, findings: Findings) -> bool:
    """True when the overflow policy may cut the prompt to fit the window (never for a request over the KV budget;
    only a locally counted prompt can be cut exactly)."""
    over = plan.action is Action.REJECT and isinstance(plan.error, ContextLengthExceeded)
    return over and choice is not Overflow.REJECT and findings.count_source is CountSource.LOCAL

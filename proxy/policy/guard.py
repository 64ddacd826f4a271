"""The request path of a guarded endpoint: parse -> count -> decide, then the overflow policy when the prompt does
not fit. Returns what to do (forward a body, refuse, or fan out parts); the server does it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.api.body import with_changes
from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.source import LOCAL, RemoteCount, chat_tokens, completion_tokens
from proxy.policy.choice import choose_policy
from proxy.policy.decide import Limits, Plan, decide_chat, decide_completion, limits_for
from proxy.policy.outcome import Chunked, Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.overflow import overflow_chat, overflow_completion
from proxy.policy.reduce import reduce_request
from proxy.settings import PolicySettings, Settings


@dataclass
class Guard:
    settings: Settings
    registry: ModelRegistry
    remote: RemoteCount | None = None  # counts through the upstream (counting.source); None: always local

    def __post_init__(self) -> None:
        self._policies = {m.name: m.policy for m in self.settings.models if m.policy is not None}

    async def handle(self, path: str, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
        if path.endswith("/chat/completions"):
            outcome = await self._chat(raw, headers, findings)
        else:
            outcome = await self._completion(raw, headers, findings)
        if outcome.decision.count_source is None and findings.count_source is not None:  # the overflow policies'
            outcome = replace(outcome, decision=replace(outcome.decision, count_source=findings.count_source))
        findings.decision = outcome.decision
        return outcome

    async def _chat(self, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
        server = self.settings.server
        req = parse_chat(raw, server.max_messages, server.max_json_depth)
        findings.max_tokens_before = req.requested_output[1] if req.requested_output else None
        model, policy, choice, limits = self._target(req.model, headers, findings)
        started = time.perf_counter()
        prompt_tokens, findings.count_source = await chat_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        plan = decide_chat(req, prompt_tokens, limits)
        # Truncate and chunk re-count their cuts here; only a locally counted prompt can be cut exactly.
        if plan.action == "reject" and choice != "reject" and findings.count_source == LOCAL:
            return await overflow_chat(model.tokenizer, model.counter, req, plan, limits, policy, choice)
        return _as_outcome(plan, req.body, raw, plan.cost(limits, req.n), findings.count_source)

    async def _completion(self, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
        req = parse_completion(raw, self.settings.server.max_json_depth)
        findings.max_tokens_before = req.requested_output[1]
        model, policy, choice, limits = self._target(req.model, headers, findings)
        started = time.perf_counter()
        counts, findings.count_source = await completion_tokens(model, req, self.remote)
        findings.count_s = time.perf_counter() - started
        plan = decide_completion(req, counts, limits)
        if plan.action == "reject" and choice != "reject" and findings.count_source == LOCAL:
            return await overflow_completion(model.tokenizer, req, counts, plan, limits, policy, choice)
        return _as_outcome(plan, req.body, raw, plan.cost(limits, req.n * len(req.prompts)), findings.count_source)

    def _target(
        self, name: str | None, headers: Mapping[str, str], findings: Findings
    ) -> tuple[GuardedModel, PolicySettings, str, Limits]:
        """The model a request is for, its policy, the overflow choice (config or header) and its limits."""
        model = self.registry.resolve(name)
        findings.model = model.name
        policy = self.policy_for(model.name)
        return model, policy, choose_policy(policy, headers), limits_for(model.name, model.max_model_len, policy)

    def policy_for(self, model: str) -> PolicySettings:
        return self._policies.get(model) or self.settings.policy

    async def reduce(self, chunked: Chunked, answers: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
        """The map-reduce step's request and its cost, or None when it would not fit (see policy/reduce.py)."""
        model = self.registry.resolve(chunked.original.model)
        limits = limits_for(model.name, model.max_model_len, chunked.policy)
        return await reduce_request(model, chunked, answers, limits)


def _as_outcome(plan: Plan, body: dict[str, Any], raw: bytes, cost: int, source: str | None) -> Outcome:
    decision = Decision.of(plan, source)
    if plan.error is not None:
        return Refuse(plan.error, decision)
    return Forward(with_changes(body, plan.changes) if plan.changes else raw, decision, cost)

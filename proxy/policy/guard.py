"""The request path of a guarded endpoint: parse -> count -> decide, then the overflow policy when the prompt does
not fit. Returns what to do (forward a body, refuse, or fan out parts); the app does it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.api.body import with_changes
from proxy.api.chat import ChatRequest, parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.count import count_chat, count_completion
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.policy.choice import choose_policy
from proxy.policy.decide import Limits, Plan, decide_chat, decide_completion
from proxy.policy.merge import part_text
from proxy.policy.overflow import FanOut, Forward, Outcome, Refuse, overflow_chat, overflow_completion
from proxy.server.record import RequestRecord
from proxy.settings import PolicySettings, Settings
from proxy.upstream.client import Upstream


@dataclass
class Guard:
    settings: Settings
    registry: ModelRegistry
    upstream: Upstream

    async def handle(self, path: str, raw: bytes, headers: Mapping[str, str], record: RequestRecord) -> Outcome:
        if path.endswith("/chat/completions"):
            outcome = await self._chat(raw, headers, record)
        else:
            outcome = await self._completion(raw, headers, record)
        _note(record, outcome)
        return outcome

    async def _chat(self, raw: bytes, headers: Mapping[str, str], record: RequestRecord) -> Outcome:
        server = self.settings.server
        req = parse_chat(raw, server.max_messages, server.max_json_depth)
        record.max_tokens_before = req.requested_output[1] if req.requested_output else None
        model, policy, choice, limits = self._target(req.model, headers, record)
        started = time.perf_counter()
        prompt_tokens = await count_chat(model.tokenizer, req, model.counter)
        record.count_s = time.perf_counter() - started
        plan = decide_chat(req, prompt_tokens, limits)
        if plan.action == "reject" and choice != "reject":
            return await overflow_chat(model.tokenizer, model.counter, req, plan, limits, policy, choice)
        return _as_outcome(plan, req.body, raw, plan.cost(limits, req.n))

    async def _completion(self, raw: bytes, headers: Mapping[str, str], record: RequestRecord) -> Outcome:
        req = parse_completion(raw, self.settings.server.max_json_depth)
        record.max_tokens_before = req.requested_output[1]
        model, policy, choice, limits = self._target(req.model, headers, record)
        started = time.perf_counter()
        counts = await count_completion(model.tokenizer, req, model.counter)
        record.count_s = time.perf_counter() - started
        plan = decide_completion(req, counts, limits)
        if plan.action == "reject" and choice != "reject":
            return await overflow_completion(model.tokenizer, req, counts, plan, limits, policy, choice)
        return _as_outcome(plan, req.body, raw, plan.cost(limits, req.n * len(req.prompts)))

    def _target(
        self, name: str | None, headers: Mapping[str, str], record: RequestRecord
    ) -> tuple[GuardedModel, PolicySettings, str, Limits]:
        """The model a request is for, its policy, the overflow choice (config or header) and its limits."""
        model = self.registry.resolve(name)
        record.model = model.name
        policy = self.policy_for(model.name)
        return model, policy, choose_policy(policy, headers), model.limits(policy)

    def policy_for(self, model: str) -> PolicySettings:
        return self._policies.get(model) or self.settings.policy

    def __post_init__(self) -> None:
        self._policies = {m.name: m.policy for m in self.settings.models if m.policy is not None}

    async def reduce_body(self, fan: FanOut, answers: list[dict[str, Any]]) -> tuple[dict[str, Any], int] | None:
        """The map-reduce step: one more request asking the model to combine the partial answers, or None when even
        that request would not fit (the caller then joins the answers instead)."""
        joined = fan.policy.chunk_separator.join(part_text(fan.kind, a) for a in answers)
        prompt = fan.policy.reduce_prompt.format(answers=joined)
        model = self.registry.resolve(fan.original.model)
        limits = model.limits(fan.policy)
        body = {k: v for k, v in fan.original.body.items() if k != "stream_options"} | {"stream": False}
        if isinstance(fan.original, ChatRequest):
            kept = [m for m in fan.original.messages if m.get("role") in ("system", "developer")]
            messages = [*kept, {"role": "user", "content": prompt}]
            body["messages"] = messages
            req = parse_chat(with_changes(body, {}))
            plan = decide_chat(req, await count_chat(model.tokenizer, req, model.counter), limits)
        else:
            body["prompt"] = prompt
            completion = parse_completion(with_changes(body, {}))
            counts = await count_completion(model.tokenizer, completion, model.counter)
            plan = decide_completion(completion, counts, limits)
        return None if plan.action == "reject" else ({**body, **plan.changes}, plan.cost(limits, 1))


def _note(record: RequestRecord, outcome: Outcome) -> None:
    """What the decision was, for the request's log line and metrics (read back from the headers it sends)."""
    headers = outcome.headers
    record.action = headers.get("x-token-guard-action")
    record.prompt_tokens = _int(headers.get("x-token-guard-prompt-tokens"))
    record.max_tokens_after = _int(headers.get("x-token-guard-max-tokens"))
    record.chunks = _int(headers.get("x-token-guard-chunks"))
    record.truncated_tokens = _int(headers.get("x-token-guard-truncated-tokens"))


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


def _as_outcome(plan: Plan, body: dict[str, Any], raw: bytes, cost: int) -> Outcome:
    if plan.error is not None:
        return Refuse(plan.error, plan.headers())
    return Forward(with_changes(body, plan.changes) if plan.changes else raw, plan.headers(), cost)

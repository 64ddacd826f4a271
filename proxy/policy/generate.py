"""The decision for token-in generation (`/inference/v1/generate`): the prompt is its token ids, the output limit
`sampling_params.max_tokens`, and the chat rules apply to them.

    pass / clamp    a max_tokens above the room the prompt leaves is lowered to it (min_tokens with it); with none,
                    vLLM fills the window unless policy.default_max_tokens (or the key's cap) sets one
    reject          fewer than min_output_tokens of room: vLLM refuses a prompt of the window or more, and the guard
                    the same, before it reaches the GPU
    partial         `content_parts`: vLLM adds the media's tokens, so the count is a lower bound; refused only when
                    the token ids alone leave no room, and the limit is never clamped on that guess (only to the key's
                    cap)
    truncate, chunk refused with the reason: token ids carry no turns to drop, nor text to split

vLLM itself never refuses an output limit over the room here (the engine stops at the window), so a clamp changes
what the request reserves, not what it gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.api.body import with_changes
from proxy.api.tokens import SAMPLING, GenerateRequest, generate_request
from proxy.counting.source import CountSource
from proxy.policy.decide import Action, Limits, Plan, decide_output
from proxy.policy.outcome import Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.overflow import refuse
from proxy.policy.steps import Steps
from proxy.settings import Overflow

PARAM = "token_ids"
WHY_NOT: dict[str, str] = {
    Overflow.TRUNCATE: "The truncate policy was not applied: the guard does not cut token-id prompts of this endpoint.",
    Overflow.CHUNK: "The chunk policy was not applied: the guard does not split token-id prompts of this endpoint.",
}


def decide_generate(req: GenerateRequest, raw: bytes, limits: Limits, choice: str) -> Outcome:
    decided = decide_output(req.prompt_tokens, limits, "max_tokens", req.max_tokens, PARAM, req.n)
    plan = _with_min_tokens(decided, req)
    if req.media:
        return _partial(req, raw, plan, limits)
    if plan.error is not None:
        return refuse(plan, WHY_NOT[choice]) if choice in WHY_NOT else Refuse(plan.error, Decision.of(plan))
    body = _body(req, plan.changes) if plan.changes else raw
    return Forward(body, Decision.of(plan), plan.cost(limits, req.n))


def _partial(req: GenerateRequest, raw: bytes, plan: Plan, limits: Limits) -> Outcome:
    if plan.error is not None:
        return refuse(plan, "That is without the media of content_parts, which adds more.")
    cap, limit = limits.max_output, req.max_tokens
    body = raw
    if cap is not None and (limit is None or limit > cap):
        body, limit = _body(req, {"max_tokens": cap}), cap
    cost = Plan(Action.PASS, req.prompt_tokens, limit).cost(limits, req.n)
    return Forward(body, Decision(Action.PARTIAL, req.prompt_tokens, limit), cost)


def _with_min_tokens(plan: Plan, req: GenerateRequest) -> Plan:
    """min_tokens lowered with a limit it would exceed (vLLM refuses min_tokens over max_tokens)."""
    if plan.max_tokens is None or req.min_tokens is None or req.min_tokens <= plan.max_tokens:
        return plan
    changes = {**plan.changes, "min_tokens": plan.max_tokens}
    return Plan(Action.CLAMP, plan.prompt_tokens, plan.max_tokens, changes, plan.error)


def _body(req: GenerateRequest, changes: dict[str, int]) -> bytes:
    return with_changes(req.body, {SAMPLING: {**req.sampling, **changes}})


async def tokens(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    """Token-in generation: the token ids are the count."""
    req = generate_request(body)
    findings.max_tokens_before = req.max_tokens
    choice, limits = steps.target(req.model, headers, findings)[2:]
    findings.count_source = CountSource.LOCAL
    return decide_generate(req, raw, limits, choice)

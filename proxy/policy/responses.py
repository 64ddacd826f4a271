"""The Responses recipe: target, a background response named, the stored conversation it continues (ledger.py), the
timed count of what vLLM renders, and the decision of a converted request (converted.py), cut by whole turns; vLLM
0.34's thinking_token_budget kept within a lowered limit (token_budget.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.body import with_changes
from proxy.api.responses import LIMIT_FIELD, responses_request
from proxy.api.routes import Reads
from proxy.counting.local_count import count_chat
from proxy.policy import background, token_budget
from proxy.policy.client_cut import ClientCut, Rules, held_back, rules_of
from proxy.policy.continued import continued, continued_chat
from proxy.policy.converted import Converted, decide, response_kept, response_turn
from proxy.policy.ledger import Turn
from proxy.policy.outcome import Findings, Forward, Outcome
from proxy.policy.steps import Steps, local_recount


async def responses(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    req = responses_request(body, steps.max_messages)
    findings.max_tokens_before = req.max_output_tokens
    model, _, choice, limits = steps.target(req.model, headers, findings, req.body, Reads.RESPONSES)
    named, follows = background.named(req, steps.settings.admission)
    if named is not req:  # the guard names a background response: the body forwarded carries its id
        req, raw = named, with_changes(named.body, {})
    newer = steps.registry.upstream_newer()
    entry = await continued(steps.ledger, req, findings.owner) if steps.ledger is not None else None
    chat, messages = continued_chat(model.tokenizer, req, newer, entry)
    partial = req.previous_response_id is not None and messages is None
    if steps.ledger is not None and (req.store or entry is not None):  # before counting: an uncounted one too
        messages = None if req.background else messages  # background: answered empty at first
        findings.turn = Turn(findings.owner, model.name, messages, entry, req.store, chat.harmony is not None)
    prompt_tokens = await steps.count(model, chat, findings)
    if not (partial or req.truncation_auto or req.background):  # the whole prompt, in an answer that says its usage
        findings.expected = prompt_tokens

    async def recount(items: list[Any]) -> int:
        cut = replace(req, input=items, body={**req.body, "input": items})
        return await count_chat(model.tokenizer, continued_chat(model.tokenizer, cut, newer, entry)[0],
                                model.counter)  # fmt: skip

    budgeted = steps.registry.upstream_at_least((0, 34))  # earlier releases ignore thinking_token_budget
    conv = Converted(
        "/v1/responses", req.body, raw, LIMIT_FIELD, req.max_output_tokens, "input", "input", req.input,
        response_turn, response_kept, partial=partial, upstream_truncates=req.truncation_auto,
        follow=token_budget.follower(req.body, req.max_output_tokens) if budgeted else None,
    )  # fmt: skip
    outcome = await decide(conv, prompt_tokens, limits, choice, local_recount(findings, recount))
    if req.truncation_auto and newer and not (partial or req.background) and isinstance(outcome, Forward):
        outcome = _cut_by_vllm(outcome, limits.max_model_len, rules_of(steps.registry), findings)
    return replace(outcome, follows=follows) if follows is not None and isinstance(outcome, Forward) else outcome


def _cut_by_vllm(outcome: Forward, window: int, rules: Rules, findings: Findings) -> Forward:
    """`truncation: "auto"` is vLLM's truncate_prompt_tokens -1: from 0.32 it keeps the window less one token when the
    request forwarded sets an output limit (0.33: when it sets none, too), and says so in its usage."""
    decision = outcome.decision
    held = held_back(decision.max_tokens, rules)
    kept = findings.expected = ClientCut(-1, None).kept(decision.prompt_tokens, window, held)
    return replace(outcome, decision=replace(decision, prompt_tokens=kept))

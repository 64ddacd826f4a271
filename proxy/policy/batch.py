"""The decision for a batch chat request (`/v1/chat/completions/batch`): each conversation is counted as chat, and
the one output limit the batch shares is decided for its longest conversation, as a completions batch is.

    pass / clamp    the chat rules on the longest conversation: every sent limit field above the room it leaves is
                    lowered to it (min_tokens with it), so that every conversation fits
    reject          the longest leaves no room: the 400 names which conversation
    truncate, chunk refused with the reason: cutting or splitting one conversation of a batch answers another
                    question than the one asked, and the batch's answers are not merged

The prompt tokens the guard reports are the conversations' sum (vLLM's `usage.prompt_tokens` for the batch), and
the cost is the KV cache the batch holds: every conversation's prompt plus its output limit (the room it leaves when
the request sets none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.batch import BatchChatRequest, batch_chat_request
from proxy.api.body import with_changes
from proxy.counting.bound import verbatim_texts
from proxy.counting.source import CountSource, batch_tokens
from proxy.errors import ContextLengthExceeded
from proxy.policy.decide import Action, Limits, Plan, decide_chat, reject_at_least
from proxy.policy.outcome import Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.size import proven_over
from proxy.policy.steps import Steps, refuse_untrusted, timed
from proxy.settings import Overflow

WHY_NOT: dict[str, str] = {
    Overflow.TRUNCATE: "The truncate policy was not applied: a cut conversation of a batch asks another question.",
    Overflow.CHUNK: "The chunk policy was not applied: the answers of a batch's chunks cannot be merged.",
}


def decide_batch(req: BatchChatRequest, counts: list[int], raw: bytes, limits: Limits, choice: str,
                 source: str | None) -> Outcome:  # fmt: skip
    longest = max(range(len(counts)), key=counts.__getitem__)
    if limits.max_cost is not None:  # the conversations share the KV budget, as a completions batch's prompts do
        limits = replace(limits, max_cost=limits.max_cost // len(counts))
    plan = decide_chat(req.chats[longest], counts[longest], limits)
    total = sum(counts)
    if plan.error is not None:
        which = f" That is conversation {longest} (messages[{longest}]) of {len(counts)}." if len(counts) > 1 else ""
        return refuse_batch(plan, total, which, choice, source)
    decision = Decision(plan.action, total, plan.max_tokens, count_source=source)
    body = with_changes(req.body, plan.changes) if plan.changes else raw
    return Forward(body, decision, batch_cost(counts, plan.max_tokens, limits))


def refuse_batch(plan: Plan, total: int, which: str, choice: str, source: str | None) -> Refuse:
    assert plan.error is not None
    if not isinstance(plan.error, ContextLengthExceeded):  # over the whole KV budget: its own reason
        return Refuse(plan.error, Decision(Action.REJECT, total, count_source=source))
    why = f" {WHY_NOT[choice]}" if choice in WHY_NOT else ""
    error = ContextLengthExceeded(f"{plan.error.message}{which}{why}", param="messages")
    return Refuse(error, Decision(Action.REJECT, total, count_source=source))


def batch_cost(counts: list[int], limit: int | None, limits: Limits) -> int:
    """KV tokens the batch holds: each conversation's prompt plus its output limit (with none, the window)."""
    return sum(n + limit for n in counts) if limit is not None else limits.max_model_len * len(counts)


async def batch(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    """Each conversation counted as chat; the shared output limit decided for the longest."""
    req = batch_chat_request(body, steps.max_messages)
    findings.max_tokens_before = req.requested_output[1] if req.requested_output else None
    model, policy, choice, limits = steps.target(req.model, headers, findings)
    refuse_untrusted(policy, req.chats[0])
    if model.tokenizer.native is None:
        texts = [list(verbatim_texts(chat.messages)) for chat in req.chats]
        floor = await proven_over(model, texts, limits.max_model_len - limits.min_output_tokens)
        if floor is not None:
            findings.count_source = CountSource.SIZE_FLOOR
            return refuse_batch(reject_at_least(floor, limits, "messages"), floor, "", choice, CountSource.SIZE_FLOOR)
    counts = await timed(findings, batch_tokens(model, req, steps.remote))
    return decide_batch(req, counts, raw, limits, choice, findings.count_source)

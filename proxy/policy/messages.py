"""The Anthropic Messages recipe: target, the timed count of what vLLM renders, and the decision of a converted
request (converted.py), cut by whole turns; a thinking budget kept within a lowered limit, or thinking turned off and
the request counted and decided again (thinking.py); vLLM 0.34's min_tokens checked and kept within the limit
(min_tokens.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.anthropic import MessagesRequest, messages_request
from proxy.api.body import with_changes
from proxy.api.routes import Reads
from proxy.counting.anthropic import messages_chat
from proxy.counting.local_count import count_chat
from proxy.policy import min_tokens, thinking
from proxy.policy.converted import Converted, decide, message_kept, message_turn
from proxy.policy.outcome import Findings, Outcome
from proxy.policy.steps import Steps, Target, local_recount


async def messages(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    req = messages_request(body, False, steps.max_messages)
    findings.max_tokens_before = req.max_tokens
    target = steps.target(req.model, headers, findings, req.body, Reads.MESSAGES)
    outcome = await _decided(steps, target, req, raw, findings)
    if not thinking.needs_off(outcome, req):
        return thinking.noted(outcome, req, disabled=False)
    off = thinking.without_thinking(req)  # renders differently: counted and decided again
    outcome = await _decided(steps, target, off, with_changes(off.body, {}), findings)
    return thinking.noted(outcome, req, disabled=True)


async def _decided(steps: Steps, target: Target, req: MessagesRequest, raw: bytes, findings: Findings) -> Outcome:
    model, newer = target.model, steps.registry.upstream_newer()
    least = min_tokens.checked(req) if steps.registry.upstream_at_least((0, 34)) else None  # earlier ones ignore it
    prompt_tokens = findings.expected = await steps.count(model, messages_chat(model.tokenizer, req, newer), findings)

    async def recount(items: list[Any]) -> int:
        cut = replace(req, messages=items, body={**req.body, "messages": items})
        return await count_chat(model.tokenizer, messages_chat(model.tokenizer, cut, newer), model.counter)

    conv = Converted(
        "/v1/messages", req.body, raw, "max_tokens", req.max_tokens, "messages", "messages", req.messages,
        message_turn, message_kept, follow=min_tokens.both(thinking.follower(req), min_tokens.follower(least)),
    )  # fmt: skip
    return await decide(conv, prompt_tokens, target.limits, target.choice, local_recount(findings, recount))

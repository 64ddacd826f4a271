"""The completions recipe: target, size floor, timed count of each prompt, the completions decision (decide.py), and
the truncate or chunk cut (overflow.py) for a prompt over the window that was counted here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.api.completions import completion_request
from proxy.counting.source import completion_tokens
from proxy.errors import PermissionDenied
from proxy.policy.client_cut import client_cut, held_back, rules_of
from proxy.policy.decide import decide_completion
from proxy.policy.outcome import Findings, Outcome, outcome_of
from proxy.policy.overflow import overflow_completion
from proxy.policy.size import refuse_by_size
from proxy.policy.steps import Steps, fits_by_cutting, timed


async def completion(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    req = completion_request(body)
    findings.max_tokens_before = req.requested_output[1]
    model, policy, choice, limits = steps.target(req.model, headers, findings, req.body)
    if req.embeds and findings.api_key is not None and not findings.api_key.prompt_embeds:
        raise PermissionDenied("This API key may not send prompt_embeds ([[keys]] prompt_embeds = false).")
    cut, window = client_cut(req.body), limits.max_model_len
    if cut is None:  # a floor on the whole prompt says nothing of what vLLM keeps of it
        texts = [[p] for p in req.prompts if isinstance(p, str)]
        proven = await refuse_by_size(model, texts, limits, choice, policy, "prompt", findings)
        if proven is not None:
            return proven
    else:
        cut.check(window)
    counts = await timed(findings, completion_tokens(model, req, steps.remote))
    if cut is not None:  # each prompt is cut on its own; vLLM's default of 16 is an output limit
        held = held_back(req.requested_output[1], rules_of(steps.registry))
        counts = [cut.kept(n, window, held) for n in counts]
    findings.expected = None if req.embeds else sum(counts)  # vLLM's usage: every prompt's tokens, each once
    plan = decide_completion(req, counts, limits)
    if fits_by_cutting(plan, choice, findings):
        return await overflow_completion(model.tokenizer, req, counts, plan, limits, policy, choice)
    return outcome_of(plan, req.body, raw, plan.cost(limits, req.sequences), findings.count_source)

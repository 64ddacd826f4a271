"""The completions recipe: target, size floor, timed count of each prompt, the completions decision (decide.py), and
the truncate or chunk cut (overflow.py) for a prompt over the window that was counted here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.completions import CompletionRequest, completion_request
from proxy.counting.registry import GuardedModel
from proxy.counting.source import CountSource, completion_tokens
from proxy.errors import PermissionDenied
from proxy.policy.client_cut import ClientCut, client_cut, held_back, rules_of
from proxy.policy.decide import decide_completion
from proxy.policy.outcome import Findings, Outcome, outcome_of
from proxy.policy.overflow import overflow_completion
from proxy.policy.size import proven_over, refuse_by_size
from proxy.policy.steps import Steps, fits_by_cutting, timed


async def completion(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    req = completion_request(body)
    findings.max_tokens_before = req.requested_output[1]
    model, policy, choice, limits = steps.target(req.model, headers, findings, req.body)
    if req.embeds and findings.api_key is not None and not findings.api_key.prompt_embeds:
        raise PermissionDenied("This API key may not send prompt_embeds ([[keys]] prompt_embeds = false).")
    cut = client_cut(req.body)
    if cut is None:  # a floor on the whole prompt says nothing of what vLLM keeps of it
        texts = [[p] for p in req.prompts if isinstance(p, str)]
        proven = await refuse_by_size(model, texts, limits, choice, policy, "prompt", findings)
        if proven is not None:
            return proven
        counts = await timed(findings, completion_tokens(model, req, steps.remote))
    else:
        counts = await _kept_counts(steps, model, req, cut, limits.max_model_len, findings)
    findings.expected = None if req.embeds else sum(counts)  # vLLM's usage: every prompt's tokens, each once
    plan = decide_completion(req, counts, limits)
    if fits_by_cutting(plan, choice, findings):
        return await overflow_completion(model.tokenizer, req, counts, plan, limits, policy, choice)
    return outcome_of(plan, req.body, raw, plan.cost(limits, req.sequences), findings.count_source)


async def _kept_counts(
    steps: Steps, model: GuardedModel, req: CompletionRequest, cut: ClientCut, window: int, findings: Findings
) -> list[int]:
    """Each prompt's tokens as vLLM runs them under the client's cut: what vLLM keeps of each (vLLM's default of 16 is
    an output limit; a cut longer than the window is vLLM's 400). A text prompt whose size alone proves it at least as
    long as the cut is not encoded."""
    cut.check(window)
    keep = cut.limit(window, held_back(req.requested_output[1], rules_of(steps.registry)))
    if req.embeds or model.tokenizer.native is not None:
        return [min(n, keep) for n in await timed(findings, completion_tokens(model, req, steps.remote))]
    proven = [isinstance(p, str) and (keep == 0 or await proven_over(model, [[p]], keep - 1) is not None)
              for p in req.prompts]  # fmt: skip
    rest = [p for p, over in zip(req.prompts, proven, strict=True) if not over]
    counts: list[int] = []
    if rest:  # only the prompts not proven over the cut are encoded
        unproven = replace(req, prompts=rest, body={**req.body, "prompt": rest})
        counts = await timed(findings, completion_tokens(model, unproven, steps.remote))
    counted = iter(counts)
    findings.count_source = findings.count_source or CountSource.LOCAL
    return [keep if over else min(next(counted), keep) for over in proven]

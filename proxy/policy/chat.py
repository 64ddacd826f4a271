"""The chat completions recipe: target, size floor, timed count, the chat decision (decide.py), and the truncate or
chunk cut (overflow.py) for a prompt over the window that was counted here. `tools: []` is read as the upstream reads
it (as_upstream_tools)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.chat import ChatRequest, chat_request
from proxy.api.routes import Reads
from proxy.counting.bound import verbatim_texts
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.source import CountSource
from proxy.errors import InvalidRequest
from proxy.policy.client_cut import ClientCut, client_cut, held_back, rules_of
from proxy.policy.decide import decide_chat
from proxy.policy.outcome import Findings, Outcome, outcome_of
from proxy.policy.overflow import overflow_chat
from proxy.policy.size import proven_over, refuse_by_size
from proxy.policy.steps import Steps, fits_by_cutting, refuse_untrusted


async def chat(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    req = chat_request(body, steps.max_messages)
    if req.tools == []:  # the one value whose reading depends on the upstream's release
        req = as_upstream_tools(req, steps.registry)
    findings.max_tokens_before = req.requested_output[1] if req.requested_output else None
    model, policy, choice, limits = steps.target(req.model, headers, findings, req.body, Reads.CHAT)
    refuse_untrusted(policy, req)
    cut = client_cut(req.body)
    if cut is None:  # a floor on the whole prompt says nothing of what vLLM keeps of it
        texts = [list(verbatim_texts(req.messages))]
        proven = await refuse_by_size(model, texts, limits, choice, policy, "messages", findings)
        if proven is not None:
            return proven
        prompt_tokens = findings.expected = await steps.count(model, req, findings)
    else:
        prompt_tokens = findings.expected = await _kept_count(steps, model, req, cut, limits.max_model_len, findings)
    plan = decide_chat(req, prompt_tokens, limits)
    if fits_by_cutting(plan, choice, findings):  # truncate and chunk re-count their cuts
        return await overflow_chat(model.tokenizer, model.counter, req, plan, limits, policy, choice)
    return outcome_of(plan, req.body, raw, plan.cost(limits, req.n), findings.count_source)


NO_EMPTY_TOOLS = (
    "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely. (parameter=tools)"
)


def as_upstream_tools(req: ChatRequest, registry: ModelRegistry) -> ChatRequest:
    """`tools: []` as the upstream reads it: vLLM 0.31 to 0.33 refuse it; 0.34 reads it as no tools (rendered and
    counted so), unless `tool_choice` names a tool (which it then does not find: its 400); an unknown version: as
    sent."""
    if req.tools != []:
        return req
    if registry.upstream_at_least((0, 34)):
        return req if isinstance(req.body.get("tool_choice"), dict) else replace(req, tools=None)
    if registry.upstream_version is not None:
        raise InvalidRequest(NO_EMPTY_TOOLS, param="tools")
    return req


async def _kept_count(
    steps: Steps, model: GuardedModel, req: ChatRequest, cut: ClientCut, window: int, findings: Findings
) -> int:
    """The prompt tokens vLLM runs under the client's cut: what vLLM keeps (a cut longer than the window is vLLM's
    400). A prompt whose verbatim texts alone prove it at least as long as the cut is not encoded: its count is the
    cut's (a prompt of megabytes cut to a few tokens costs its reading, as a refusal by size does)."""
    cut.check(window)
    output = req.requested_output
    keep = cut.limit(window, held_back(output[1] if output else None, rules_of(steps.registry)))
    texts = [list(verbatim_texts(req.messages))]
    if keep == 0 or (model.tokenizer.native is None and await proven_over(model, texts, keep - 1) is not None):
        findings.count_source = CountSource.LOCAL
        return keep
    return min(await steps.count(model, req, findings), keep)

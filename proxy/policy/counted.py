"""The count routes' recipes: Anthropic's count_tokens, answered by the guard as vLLM answers it, and the render
routes, answered by the guard with `render.local` (rendered.py), else forwarded unchanged once their prompt is counted
(vLLM renders it; nothing is generated, nothing is clamped).
A prompt whose size proves it over the window is refused from that floor, uncounted, as on the other routes."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

from proxy.api.anthropic import messages_request
from proxy.api.chat import ChatRequest, chat_request
from proxy.api.completions import completion_request
from proxy.api.responses import responses_request
from proxy.counting.anthropic import messages_chat
from proxy.counting.bound import verbatim_texts
from proxy.counting.source import completion_tokens
from proxy.policy import rendered
from proxy.policy.continued import continued_chat
from proxy.policy.converted import count_answer
from proxy.policy.decide import Action
from proxy.policy.outcome import Decision, Findings, Forward, Outcome
from proxy.policy.render_body import RenderKind
from proxy.policy.size import refuse_by_size
from proxy.policy.steps import Steps, Target, refuse_untrusted
from proxy.settings import Overflow

COUNTS_PAST_WINDOW = (0, 34)  # vLLM's count_tokens counts a prompt over the window, as /tokenize does


class CountRecipe(Protocol):
    """A count route's path: `answered`, the guard answers the count itself; else it forwards the body."""

    def __call__(
        self, steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings,
        answered: bool,
    ) -> Awaitable[Outcome]: ...  # fmt: skip


async def completion(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings, answered: bool
) -> Outcome:
    req = completion_request(body)
    target = steps.target(req.model, headers, findings)
    model, policy, _, limits = target
    texts = [[p] for p in req.prompts if isinstance(p, str)]
    proven = await refuse_by_size(model, texts, limits, Overflow.REJECT, policy, "prompt", findings)
    if proven is not None:
        return proven
    why = None
    if steps.settings.render.local:
        local = await rendered.render_completion(steps, target, req, headers, findings)
        if not isinstance(local, str):
            return local
        why = local
    counts, findings.count_source = await completion_tokens(model, req, steps.remote)
    return Forward(raw, Decision(Action.COUNT, sum(counts), count_source=findings.count_source, render=why))


async def messages(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings, answered: bool
) -> Outcome:
    req = messages_request(body, True, steps.max_messages)
    target = steps.target(req.model, headers, findings)
    chat = messages_chat(target.model.tokenizer, req, steps.registry.upstream_newer())
    return await _counted(steps, target, chat, raw, findings, answered, ("messages", body, headers))


async def responses(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings, answered: bool
) -> Outcome:
    req = responses_request(body, steps.max_messages)
    target = steps.target(req.model, headers, findings)
    chat = continued_chat(target.model.tokenizer, req, steps.registry.upstream_newer(), None)[0]  # gpt-oss: harmony
    return await _counted(steps, target, chat, raw, findings, answered, ("responses", body, headers))


async def chat(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings, answered: bool
) -> Outcome:
    req = chat_request(body, steps.max_messages)
    target = steps.target(req.model, headers, findings)
    refuse_untrusted(target.policy, req)
    return await _counted(steps, target, req, raw, findings, answered, ("chat", body, headers))


async def _counted(
    steps: Steps, target: Target, chat: ChatRequest, raw: bytes, findings: Findings, answered: bool,
    render: tuple[RenderKind, dict[str, Any], Mapping[str, str]],
) -> Outcome:  # fmt: skip
    model, policy, _, limits = target
    past_window = answered and steps.registry.upstream_at_least(COUNTS_PAST_WINDOW)
    if not past_window:  # a size that proves the prompt over the window is refused uncounted
        texts = [list(verbatim_texts(chat.messages))]
        proven = await refuse_by_size(model, texts, limits, Overflow.REJECT, policy, "messages", findings)
        if proven is not None:
            return proven
    why = None
    if not answered and steps.settings.render.local:  # a render route the guard answers itself
        kind, body, headers = render
        local = await rendered.render_chat(steps, target, kind, chat, body, headers, findings)
        if not isinstance(local, str):
            return local
        why = local
    prompt_tokens = await steps.count(model, chat, findings)
    if answered:
        return count_answer(prompt_tokens, None if past_window else limits)
    return Forward(raw, Decision(Action.COUNT, prompt_tokens, count_source=findings.count_source, render=why))

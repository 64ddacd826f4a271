"""The render routes answered by the guard (`render.local`): the prompt's token ids from the guard's own rendering and
encoding, in the answer vLLM's render route writes for the upstream's release (render_body.py). What the guard cannot
render exactly goes to the upstream as before, and the answer says why in `x-token-guard-render`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.api.chat import ChatRequest, transferred_prompt
from proxy.api.completions import CompletionRequest
from proxy.counting.local_count import chat_ids, completion_ids
from proxy.counting.registry import GuardedModel
from proxy.counting.source import CountSource
from proxy.counting.text_ids import TokenIds
from proxy.errors import ContextLengthExceeded, CountedUpstreamOnly, InvalidRequest, TemplateRefused
from proxy.policy.decide import Action
from proxy.policy.outcome import Answer, Decision, Findings, Outcome, Refuse
from proxy.policy.render_body import RenderKind, render_answer
from proxy.policy.steps import Steps, Target

LOCAL = "local"
ELSEWHERE = {  # why the upstream renders a request (x-token-guard-render: upstream; reason=...)
    "media": "images, audio, video or files: their tokens are the model processor's",
    "request-template": "a chat template sent with the request",
    "template": "the model's chat template failed on it",
    "counted-upstream": "the model is counted by the upstream",
    "kv-transfer": "kv_transfer_params.prompt_token_ids replace its messages",
    "prompt_embeds": "prompt embeddings",
}


async def render_chat(
    steps: Steps, target: Target, kind: RenderKind, chat: ChatRequest, body: dict[str, Any],
    headers: Mapping[str, str], findings: Findings,
) -> Outcome | str:  # fmt: skip
    """The guard's answer to a chat-like render request, or why the upstream renders it."""
    why = _not_here(target.model) or _chat_not_here(chat)
    if why is not None:
        return _elsewhere(steps, why)
    try:
        ids = await chat_ids(target.model.tokenizer, chat, _encoder(steps, target.model))
    except CountedUpstreamOnly:
        return _elsewhere(steps, "media")  # images, audio: only the upstream's processor knows their tokens
    except TemplateRefused:
        return _elsewhere(steps, "template")  # the model's template failed where vLLM may still render
    return _answered(steps, target, kind, body, headers, [ids], findings)


async def render_completion(
    steps: Steps, target: Target, req: CompletionRequest, headers: Mapping[str, str], findings: Findings
) -> Outcome | str:
    why = _not_here(target.model) or ("prompt_embeds" if req.embeds else None)
    if why is not None:
        return _elsewhere(steps, why)
    prompts = await completion_ids(target.model.tokenizer, req, _encoder(steps, target.model))
    return _answered(steps, target, "completion", req.body, headers, prompts, findings)


def _answered(
    steps: Steps, target: Target, kind: RenderKind, body: dict[str, Any], headers: Mapping[str, str],
    prompts: list[list[int]], findings: Findings,
) -> Outcome:  # fmt: skip
    findings.count_source = CountSource.LOCAL
    window = target.limits.max_model_len
    tokens = sum(len(p) for p in prompts)
    decision = Decision(Action.COUNT, tokens, count_source=CountSource.LOCAL, render=LOCAL)
    if any(len(p) > window for p in prompts):
        return Refuse(_too_long(window), Decision(Action.REJECT, tokens, count_source=CountSource.LOCAL, render=LOCAL))
    tok = target.model.tokenizer
    answer = render_answer(kind, body, headers, prompts, window, steps.registry.upstream_release, tok.default_kwargs,
                           harmony=tok.rendering.mode == "harmony")  # fmt: skip
    return Answer(answer, decision)


def _too_long(window: int) -> ContextLengthExceeded:
    """vLLM's renderer stops encoding one token past the window and refuses that."""
    return ContextLengthExceeded(
        f"This model's maximum context length is {window} tokens. However, your prompt contains at least "
        f"{window + 1} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
        f"length of the input prompt.",
        param="input_tokens",
    )


def _elsewhere(steps: Steps, reason: str) -> str:
    """The header of a request the upstream renders; `token-guard render` has none to ask, and says so."""
    if steps.settings.render.only:
        raise InvalidRequest(f"token-guard render does not render this request itself ({ELSEWHERE[reason]}) and "
                             "asks no upstream: send it to vLLM's render server.")  # fmt: skip
    return f"upstream; reason={reason}"


def _not_here(model: GuardedModel) -> str | None:
    if model.count_source == CountSource.UPSTREAM:
        return "counted-upstream"  # the start-up check (or the operator) has the upstream count it
    return None


def _chat_not_here(chat: ChatRequest) -> str | None:
    if chat.chat_template is not None or chat.chat_template_kwargs.get("chat_template") is not None:
        return "request-template"
    if transferred_prompt(chat.body) is not None:
        return "kv-transfer"
    return None


def _encoder(steps: Steps, model: GuardedModel) -> TokenIds:
    return model.counter.token_ids(steps.settings.render.cache_mb)

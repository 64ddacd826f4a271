"""Who counts a request's prompt (counting.source): the guard itself, which is the fast normal case, or the upstream,
which renders and counts it with the model's own processor (proxy/upstream/remote_count.py).

Per model: "local" always counts here; "upstream" always asks vLLM; "auto" counts here unless the start-up check
found the guard disagreeing with what vLLM charges for this model (the registry then says "upstream"). Per request:
in "auto", parts only vLLM can count (images, audio) are counted by the upstream too; and a prompt the upstream's
counting endpoint refuses or fails on is counted locally (source "local"), never refused for that.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Mapping
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from proxy.api.batch import BatchChatRequest
from proxy.api.chat import ChatRequest, transferred_prompt
from proxy.api.completions import CompletionRequest
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.registry import GuardedModel
from proxy.errors import CountedUpstreamOnly, GuardError, InvalidRequest, TemplateRefused, UpstreamUnavailable

log = logging.getLogger("token_guard.count_source")


class CountSource(StrEnum):
    """Who counted a request's prompt (x-token-guard-count-source)."""

    LOCAL = "local"  # the guard
    UPSTREAM = "upstream"  # vLLM's counting endpoints (upstream/remote_count.py)
    UNCOUNTED = "none"  # neither could count it: forwarded uncounted (Uncounted)
    SIZE_FLOOR = "size"  # refused from its size alone: its prompt tokens are a lower bound (policy/size.py)


T = TypeVar("T")


class RemoteCount(Protocol):
    """Counts a request the way the upstream itself does (raises GuardError when it cannot)."""

    async def chat(self, model: str, body: dict[str, Any], effort_map: Mapping[str, str] | None = None) -> int: ...

    async def completion(self, model: str, body: dict[str, Any]) -> list[int]: ...


async def chat_tokens(model: GuardedModel, req: ChatRequest, remote: RemoteCount | None) -> tuple[int, CountSource]:
    """The prompt's token count, and who counted it; the ids vLLM would run in place of the messages, when they are
    more (kv_transfer_params.prompt_token_ids, api/chat.py)."""
    count, source = await _chat_tokens(model, req, remote)
    transferred = transferred_prompt(req.body)
    return max(count, transferred or 0), source


async def _chat_tokens(model: GuardedModel, req: ChatRequest, remote: RemoteCount | None) -> tuple[int, CountSource]:
    # a gpt-oss Responses create's harmony messages: no counting endpoint of vLLM renders a stored conversation
    if model.count_source == CountSource.UPSTREAM and remote is not None and req.harmony is None:
        try:
            return await remote.chat(model.name, req.body, model.tokenizer.effort_map), CountSource.UPSTREAM
        except (InvalidRequest, UpstreamUnavailable) as exc:
            return await _instead(model, exc, count_chat(model.tokenizer, req, model.counter)), CountSource.LOCAL
    try:
        return await count_chat(model.tokenizer, req, model.counter), CountSource.LOCAL
    except (CountedUpstreamOnly, TemplateRefused) as exc:
        if model.count_source == CountSource.LOCAL or remote is None:
            raise
        log.info("model %s: %s; counted by the upstream", model.name, exc.message)
        try:
            return await remote.chat(model.name, req.body, model.tokenizer.effort_map), CountSource.UPSTREAM
        except (InvalidRequest, UpstreamUnavailable) as failed:
            if isinstance(exc, TemplateRefused):  # neither could count it: vLLM's generation answers it
                raise Uncounted(exc, failed) from None
            raise


async def batch_tokens(
    model: GuardedModel, req: BatchChatRequest, remote: RemoteCount | None
) -> tuple[list[int], CountSource]:
    """Each conversation of a batch chat request counted as chat, and who counted them ("upstream" when any was)."""
    counts, source = [], CountSource.LOCAL
    for chat in req.chats:
        count, who = await chat_tokens(model, chat, remote)
        counts.append(count)
        source = CountSource.UPSTREAM if who is CountSource.UPSTREAM else source
    return counts, source


async def completion_tokens(
    model: GuardedModel, req: CompletionRequest, remote: RemoteCount | None
) -> tuple[list[int], CountSource]:
    """Each prompt's count, in the order vLLM runs them: the prompt_embeds tensors (their rows, read by the guard
    whoever counts the text), then the text and token-id prompts."""
    counts, source = await _prompt_tokens(model, req, remote) if req.prompts else ([], CountSource.LOCAL)
    return [*req.embeds, *counts], source


async def _prompt_tokens(
    model: GuardedModel, req: CompletionRequest, remote: RemoteCount | None
) -> tuple[list[int], CountSource]:
    if model.count_source == CountSource.UPSTREAM and remote is not None:
        try:
            return await remote.completion(model.name, req.body), CountSource.UPSTREAM
        except (InvalidRequest, UpstreamUnavailable) as exc:
            return await _instead(model, exc, count_completion(model.tokenizer, req, model.counter)), CountSource.LOCAL
    return await count_completion(model.tokenizer, req, model.counter), CountSource.LOCAL


async def _instead(model: GuardedModel, failed: GuardError, local: Coroutine[Any, Any, T]) -> T:
    """A count the upstream's counting endpoint refused or failed, done locally: that endpoint fails where generation
    does not (vLLM 0.31/0.32's /tokenize in mistral mode on any assistant turn with tool calls), so its failure is
    never the client's error. Counted in token_guard_upstream_count_fallbacks; a prompt the guard cannot count
    either gets the guard's own error."""
    model.counter.fallbacks += 1
    log.warning("model %s: the upstream could not count a prompt (%s); counted locally", model.name, failed.message)
    try:
        return await local
    except CountedUpstreamOnly:
        raise failed from None
    except TemplateRefused as refused:
        raise Uncounted(refused, failed) from None


class Uncounted(Exception):
    """Neither the guard nor the upstream's counting endpoint could count a prompt that vLLM's generation may still
    serve (the guard, not told of mistral mode, renders a template stricter than mistral_common; /tokenize refuses
    tool calls there): the guard forwards it uncounted rather than refuse it (policy/guard.py)."""

    def __init__(self, local: GuardError, upstream: GuardError) -> None:
        super().__init__(f"{local.message} / upstream: {upstream.message}")
        self.local, self.upstream = local, upstream

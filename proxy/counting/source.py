"""Who counts a request's prompt (counting.source): the guard itself, which is the fast normal case, or the upstream,
which renders and counts it with the model's own processor (proxy/upstream/counting.py).

Per model: "local" always counts here; "upstream" always asks vLLM; "auto" counts here unless the start-up check
found the guard disagreeing with what vLLM charges for this model (the registry then says "upstream"). Per request:
in "auto", parts only vLLM can count (images, audio) are counted by the upstream too.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from proxy.api.batch import BatchChatRequest
from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.count import count_chat, count_completion
from proxy.counting.registry import GuardedModel
from proxy.errors import CountedUpstreamOnly

log = logging.getLogger("token_guard.count_source")

LOCAL, UPSTREAM = "local", "upstream"


class RemoteCount(Protocol):
    """Counts a request the way the upstream itself does (raises GuardError when it cannot)."""

    async def chat(self, model: str, body: dict[str, Any]) -> int: ...

    async def completion(self, model: str, body: dict[str, Any]) -> list[int]: ...


async def chat_tokens(model: GuardedModel, req: ChatRequest, remote: RemoteCount | None) -> tuple[int, str]:
    """The prompt's token count, and who counted it."""
    if model.count_source == UPSTREAM and remote is not None:
        return await remote.chat(model.name, req.body), UPSTREAM
    try:
        return await count_chat(model.tokenizer, req, model.counter), LOCAL
    except CountedUpstreamOnly as exc:
        if model.count_source == LOCAL or remote is None:
            raise
        log.info("model %s: %s; counted by the upstream", model.name, exc.message)
        return await remote.chat(model.name, req.body), UPSTREAM


async def batch_tokens(model: GuardedModel, req: BatchChatRequest, remote: RemoteCount | None) -> tuple[list[int], str]:
    """Each conversation of a batch chat request counted as chat, and who counted them ("upstream" when any was)."""
    counts, source = [], LOCAL
    for chat in req.chats:
        count, who = await chat_tokens(model, chat, remote)
        counts.append(count)
        source = UPSTREAM if who == UPSTREAM else source
    return counts, source


async def completion_tokens(
    model: GuardedModel, req: CompletionRequest, remote: RemoteCount | None
) -> tuple[list[int], str]:
    if model.count_source == UPSTREAM and remote is not None:
        return await remote.completion(model.name, req.body), UPSTREAM
    return await count_completion(model.tokenizer, req, model.counter), LOCAL

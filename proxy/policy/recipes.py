"""Which recipe reads, counts and decides a guarded route's request: a table from the wire model that reads its body
(the route's Reads) to its endpoint's recipe module, one for the generate and pool routes and one for the count
routes. Adding an endpoint is one recipe module and one row here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.api.routes import Kind, Reads, Route
from proxy.errors import InvalidRequest
from proxy.policy import audio, counted
from proxy.policy.batch import batch
from proxy.policy.chat import chat
from proxy.policy.cohere import cohere
from proxy.policy.completions import completion
from proxy.policy.decisions import decisions
from proxy.policy.generate import tokens
from proxy.policy.messages import messages
from proxy.policy.outcome import Findings, Outcome
from proxy.policy.pooling import pooled
from proxy.policy.responses import responses
from proxy.policy.steps import Recipe, Steps

RECIPES: dict[Reads, Recipe] = {  # the generate and pool routes' (audio reads a form: form() below)
    Reads.CHAT: chat, Reads.COMPLETION: completion, Reads.RESPONSES: responses, Reads.MESSAGES: messages,
    Reads.CHAT_BATCH: batch, Reads.TOKENS: tokens, Reads.COHERE_EMBED: cohere, Reads.DECISIONS: decisions,
    Reads.EMBEDDINGS: pooled("embeddings"), Reads.POOLING: pooled("pooling"), Reads.CLASSIFY: pooled("classify"),
    Reads.SCORE: pooled("score"), Reads.RERANK: pooled("rerank"),
}  # fmt: skip
COUNTED: dict[Reads, counted.CountRecipe] = {  # the count routes'
    Reads.COMPLETION: counted.completion, Reads.COUNT_TOKENS: counted.messages, Reads.RESPONSES: counted.responses,
    Reads.CHAT: counted.chat,
}  # fmt: skip


async def run(
    steps: Steps, route: Route, reads: Reads | None, body: dict[str, Any], raw: bytes, headers: Mapping[str, str],
    findings: Findings,
) -> Outcome:  # fmt: skip
    """A JSON body read, counted and decided by the recipe of `reads` (the route's, or the endpoint an /invocations
    body is dispatched to); a kind the guard has no recipe for is a 400."""
    if route.kind is Kind.COUNT:
        count = COUNTED.get(reads) if reads is not None else None
        if count is None:
            raise InvalidRequest(f"token-guard cannot count requests of this endpoint ({reads}).")
        return await count(steps, body, raw, headers, findings, route.answered)
    recipe = RECIPES.get(reads) if reads is not None else None
    if recipe is None:
        raise InvalidRequest(f"token-guard cannot read requests of this endpoint ({reads}).")
    return await recipe(steps, body, raw, headers, findings)


def form(steps: Steps, route: Route, raw: bytes, headers: Mapping[str, str], findings: Findings) -> Outcome:
    """A multipart form (the audio routes) read, counted and decided."""
    return audio.audio(steps, route.path, raw, headers, findings)

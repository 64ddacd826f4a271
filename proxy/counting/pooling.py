"""Count the prompts of pooling requests as vLLM builds them: each input or conversation its own prompt.

Completion-style inputs are counted as completions prompts are (token ids as given); conversations as chat, with the
pooling defaults (`add_generation_prompt` false). Score and rerank texts are counted one by one with special tokens:
what a bi-encoder embeds, and a lower bound of the pair a cross-encoder reads (see policy/pooling.py).
"""

from __future__ import annotations

from typing import Any

from proxy.api.chat import chat_request
from proxy.api.cohere import CohereEmbedRequest
from proxy.api.completions import CompletionRequest
from proxy.api.pooling import PoolingRequest, ScoringRequest
from proxy.counting.local_count import count_completion
from proxy.counting.registry import GuardedModel
from proxy.counting.source import CountSource, RemoteCount, chat_tokens, completion_tokens


async def pooling_tokens(
    model: GuardedModel, req: PoolingRequest, remote: RemoteCount | None
) -> tuple[list[int], CountSource]:
    """Each prompt's token count, and who counted them ("upstream" when any was)."""
    if not req.conversations:
        return await completion_tokens(model, _prompts(req.model, req.prompts, req.add_special_tokens), remote)
    counts, source = [], CountSource.LOCAL
    for conversation in req.conversations:
        count, who = await chat_tokens(model, chat_request(req.chat_body(conversation)), remote)
        counts.append(count)
        source = CountSource.UPSTREAM if who is CountSource.UPSTREAM else source
    return counts, source


async def cohere_tokens(
    model: GuardedModel, req: CohereEmbedRequest, remote: RemoteCount | None
) -> tuple[list[int], CountSource]:
    """Cohere's /v2/embed: texts as completion-style inputs, images and mixed inputs as the conversations vLLM
    renders them (images counted where the upstream can count them, as chat's are)."""
    if req.texts:
        return await completion_tokens(model, _prompts(req.model, req.texts, True), remote)
    rendered = PoolingRequest({}, "embeddings", req.model, [], req.conversations, False, None)
    return await pooling_tokens(model, rendered, remote)


async def scoring_tokens(model: GuardedModel, req: ScoringRequest) -> tuple[list[int], list[int]]:
    """Each query's and each document's tokens alone, after the request's own per-side caps."""
    texts: list[Any] = req.queries + req.documents
    counts = await count_completion(model.tokenizer, _prompts(req.model, texts, True), model.counter) if texts else []
    queries, documents = counts[: len(req.queries)], counts[len(req.queries) :]
    return _capped(queries, req.max_tokens_per_query), _capped(documents, req.max_tokens_per_doc)


def _prompts(model: str | None, prompts: list[Any], add_special_tokens: bool) -> CompletionRequest:
    body = {"prompt": prompts, "add_special_tokens": add_special_tokens}
    return CompletionRequest(body, model, prompts, add_special_tokens, None, None, 1, False)


def _capped(counts: list[int], cap: int) -> list[int]:
    return [min(n, cap) for n in counts] if cap > 0 else counts

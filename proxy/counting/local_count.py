"""The guard's own count of a chat or completions prompt, exactly as vLLM counts it (docs/vllm-wire-contract.md,
section 12), without blocking the event loop; the upstream's count is proxy/upstream/remote_count.py.

Chat: messages -> vLLM's conversation -> the chat template -> encode with add_special_tokens false by default.
Completions: each string prompt encoded with special tokens (default true); token-id prompts counted as given.
The model's `TokenCounter` does the encoding: segment-cached, and off the event loop (see text_count.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.bound import verbatim_texts
from proxy.counting.render import render_chat, render_chat_isolated
from proxy.counting.text_count import OFF_LOOP_CHARS, TokenCounter
from proxy.counting.tokenizer import ModelTokenizer
from proxy.settings import CountingSettings

CountMessages = Callable[[list[Any]], Awaitable[int]]
"""Counts a chat request's prompt as if it held these messages: how the overflow policies try their cuts."""


async def count_chat(tok: ModelTokenizer, req: ChatRequest, counter: TokenCounter | None = None) -> int:
    if tok.effort_map:  # most servers map no effort: the request is read only where one does
        req = _effort_mapped(req, tok.effort_map)
    if tok.native is not None:  # mistral_common or openai_harmony: token ids straight from the messages
        return await asyncio.to_thread(tok.native.count_chat, req, tok.mistral_034, tok.default_kwargs)
    # A template the request brought is the client's code: it runs in a child process, bounded (isolated.py). A
    # long conversation renders in a worker thread: ~80 ms for 31 MB, and the event loop gets its turns meanwhile.
    if req.chat_template is not None:
        text = await render_chat_isolated(tok, req)
    elif sum(len(t) for t in verbatim_texts(req.messages)) > OFF_LOOP_CHARS:
        text = await asyncio.to_thread(render_chat, tok, req)
    else:
        text = render_chat(tok, req)
    (count,) = await _counter(tok, counter).count([text], req.add_special_tokens)
    return count


async def count_completion(
    tok: ModelTokenizer, req: CompletionRequest, counter: TokenCounter | None = None
) -> list[int]:
    texts = [p for p in req.prompts if isinstance(p, str)]
    if tok.native is not None and texts:
        native = [tok.native.count_text(t, req.add_special_tokens) for t in texts]
        if all(n is not None for n in native):
            counts = iter(native)
            return [next(counts) or 0 if isinstance(p, str) else len(p) for p in req.prompts]
    text_counts = iter(await _counter(tok, counter).count(texts, req.add_special_tokens) if texts else [])
    return [next(text_counts) if isinstance(p, str) else len(p) for p in req.prompts]


def _effort_mapped(req: ChatRequest, effort_map: Mapping[str, str]) -> ChatRequest:
    """The effort the server's --reasoning-effort-map rewrites the request's to before templating (vLLM 0.33+
    build_chat_params, on chat and on what Responses and Messages become); only the count's copy changes, what goes
    upstream keeps the client's effort, which vLLM maps itself."""
    effort = req.body.get("reasoning_effort")
    if not isinstance(effort, str) or effort not in effort_map:
        return req
    return replace(req, body={**req.body, "reasoning_effort": effort_map[effort]})


def _counter(tok: ModelTokenizer, counter: TokenCounter | None) -> TokenCounter:
    """The model's counter; one-off callers without one get a throwaway counter with no cache."""
    return counter if counter is not None else TokenCounter(tok.backend, CountingSettings(cache_mb=0), name=tok.source)
